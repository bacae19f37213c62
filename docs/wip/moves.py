"""Spillway's moves in one step of a replay, against the ideal's (session 21).

Needs a replay with docs/wip/victims-dump.patch applied (WIP_DUMP=PREFIX writes
PREFIX.allocs.tsv, PREFIX.frees.tsv and PREFIX.ideal.tsv) and run with
SPILLWAY_TRACE=PREFIX.shim.json --trace-out PREFIX.trace.json:
  python3 docs/wip/moves.py compare PREFIX STEP [ROWS]   moved blocks, spillway's and the ideal's
                                                  (ROWS of each group listed, default 20)
  python3 docs/wip/moves.py timeline PREFIX STEP  gaps and moves in order, beside the ideal's
Spillway's moves are matched to the record's allocations by address and time:
the part of a split block at the block's address takes its whole move.
Every time is simulated.
"""
import collections
import json
import sys

MiB = 1 << 20
NEVER = 0xFFFFFFFF


def events(path):
    d = json.load(open(path))
    return d if isinstance(d, list) else d["traceEvents"]


def load(pre, step):
    ev = events(pre + ".trace.json")
    spans = {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("name", "").startswith("step ")}
    allocs, byptr = {}, collections.defaultdict(list)
    for line in open(pre + ".allocs.tsv"):
        _, i, p, size, t, _st = line.split("\t")
        allocs[int(i)] = dict(size=int(size), t=int(t) / 1e3)
        byptr[int(p, 16)].append(int(i))

    def who(ptr, ts):  # the latest allocation at ptr made before ts
        made = [i for i in byptr.get(ptr, []) if allocs[i]["t"] <= ts]
        return max(made, key=lambda i: allocs[i]["t"]) if made else None

    moves, blocks, launches = collections.defaultdict(list), {}, 0
    for line in open(pre + ".ideal.tsv"):
        f = line.rstrip("\n").split("\t")
        if int(f[1]) != step:
            continue
        if f[0] == "L":
            launches = int(f[2])
        elif f[0] == "M":
            moves[int(f[2])].append(dict(bytes=int(f[3]), evict_after=int(f[7]), prefetch_at=int(f[8]), next_use=int(f[9])))
        elif f[0] == "B":
            blocks[int(f[2])] = dict(bytes=int(f[3]), carried=int(f[4]), alloc=int(f[5]), free=int(f[6]), uses=int(f[7]), first=int(f[8]))
    return spans[f"step {step}"], who, moves, blocks, launches


def spillway_moves(pre, span, who):
    t0, t1 = span
    for e in sorted(events(pre + ".shim.json"), key=lambda e: e.get("ts", 0)):
        if e.get("cat") == "spillway" and e.get("ph") == "X" and t0 <= e["ts"] < t1 and "block" in e.get("args", {}):
            yield e, who(int(e["args"]["block"], 16), e["ts"])


def compare(pre, step, rows=20):
    span, who, ideal, blocks, launches = load(pre, step)
    out, back = collections.Counter(), collections.Counter()
    for e, i in spillway_moves(pre, span, who):
        (out if e["name"].startswith("evict") else back)[i] += e["args"]["bytes"]
    i_out = sum(m["bytes"] for ms in ideal.values() for m in ms)
    i_in = sum(m["bytes"] for ms in ideal.values() for m in ms if m["prefetch_at"] != NEVER)
    print(f"step {step}, {launches} launches: ideal {i_out / MiB:.1f} MiB out, {i_in / MiB:.1f} in, "
          f"{len(ideal)} blocks; spillway {sum(out.values()) / MiB:.1f} out, {sum(back.values()) / MiB:.1f} in, {len(out)} blocks")
    def kind(i):
        if i not in blocks:
            return "not in the model"
        b = blocks[i]
        if b["carried"]:
            return "carried"
        # A block freed after the step's last launch: made in it, dead once
        # its uses end (session 34: llama7b's gradients).
        return "the step's, live on" if b["free"] == NEVER else (
            "the step's, freed at its end" if b["free"] >= launches else "the step's, freed in it")
    for name, ids in (("both", set(ideal) & set(out)), ("spillway only", set(out) - set(ideal)), ("ideal only", set(ideal) - set(out))):
        by = collections.defaultdict(lambda: [0, 0, 0])  # spillway out, in; the ideal's out
        for i in ids:
            by[kind(i)][0] += out[i]
            by[kind(i)][1] += back[i]
            by[kind(i)][2] += sum(m["bytes"] for m in ideal.get(i, []))
        print(f"  {name}: {len(ids)} blocks,", {k: f"spillway {v[0] / MiB:.1f} out / {v[1] / MiB:.1f} in, ideal {v[2] / MiB:.1f} out MiB" for k, v in by.items()})
        for i in sorted(ids, key=lambda i: -(out[i] or ideal[i][0]["bytes"]))[:rows]:
            print(f"    {i} {blocks.get(i)} spillway out/in {out[i] / MiB:.1f}/{back[i] / MiB:.1f} MiB ideal {ideal.get(i)}")


def timeline(pre, step):
    (t0, t1), who, ideal, _, _ = load(pre, step)
    ks = sorted((e for e in events(pre + ".shim.json") if e.get("cat") == "kernel" and t0 <= e["ts"] < t1), key=lambda e: e["ts"])
    gaps = [(b["ts"] - a["ts"] - a["dur"], a["ts"] - t0) for a, b in zip(ks, ks[1:]) if b["ts"] - a["ts"] - a["dur"] > 20]
    print(f"step {step}: {(t1 - t0) / 1e3:.2f} ms, {len(ks)} kernels busy {sum(e['dur'] for e in ks) / 1e3:.2f} ms, "
          f"gaps over 20 us {sum(g for g, _ in gaps) / 1e3:.2f} ms; longest (us, at):", [(round(g), round(t)) for g, t in sorted(gaps, reverse=True)[:12]])
    for e, i in spillway_moves(pre, (t0, t1), who):
        print(f"  {e['ts'] - t0:8.1f} +{e['dur']:6.1f} {e['name']:20s} {i} {e['args']['bytes'] >> 20} MiB ideal {ideal.get(i)}")


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5) or sys.argv[1] not in ("compare", "timeline"):
        sys.exit(__doc__)
    if sys.argv[1] == "compare":
        compare(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) == 5 else 20)
    else:
        timeline(sys.argv[2], int(sys.argv[3]))
