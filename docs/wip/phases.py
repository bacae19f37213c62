"""A step of a victims-dump replay (docs/wip/moves.py says how to make one) by
the record's phases (its Phase records: 1 forward, 2 backward, 3 optimizer),
session 35. Every time is simulated.
  python3 docs/wip/phases.py links PREFIX RECORD STEP   each phase's time, kernels busy,
                                                      spillway's bytes out / in and copy time
  python3 docs/wip/phases.py kinds PREFIX RECORD STEP   each phase's moves by where the block
                                                      was made and freed; the ideal's out
"""
import bisect
import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "harness"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moves  # noqa: E402
import spillway_record as st  # noqa: E402

MiB = 1 << 20


def links(pre, rec, S):
    step, phase, phase_at, uses, li = -1, None, [], collections.defaultdict(list), 0
    for r in st.iter_records(rec):
        n = type(r).__name__
        if n == "Step": step, li = r.step, 0
        elif n == "Phase": phase = r.phase
        elif n == "Launch" and step == S:
            for t in r.touches: uses[t.alloc].append(li)
            phase_at.append(phase); li += 1
    span, who, ideal, blocks, launches = moves.load(pre, S)
    ev = moves.events(pre + ".shim.json")
    ks = sorted((e for e in ev if e.get("cat") == "kernel" and span[0] <= e["ts"] < span[1]), key=lambda e: e["ts"])
    bounds = {}
    for i, e in enumerate(ks):
        p = phase_at[min(i, len(phase_at) - 1)]
        b = bounds.setdefault(p, [e["ts"], e["ts"] + e["dur"], 0.0])
        b[1] = e["ts"] + e["dur"]; b[2] += e["dur"]
    ph = sorted(bounds)
    for k, p in enumerate(ph):  # a phase runs to the next one's first kernel
        bounds[p][1] = bounds[ph[k + 1]][0] if k + 1 < len(ph) else span[1]
    bounds[ph[0]][0] = span[0]
    mv = collections.defaultdict(lambda: [0, 0, 0.0, 0.0])
    for e, i in moves.spillway_moves(pre, span, who):
        p = next(q for q in ph if bounds[q][0] <= e["ts"] < bounds[q][1])
        out = e["name"].startswith("evict")
        mv[p][0 if out else 1] += e["args"]["bytes"]
        mv[p][2 if out else 3] += e["dur"]
    print(f"{pre} step {S}: {(span[1] - span[0]) / 1e3:.0f} ms")
    for p in ph:
        t0, t1, busy = bounds[p]; m = mv[p]
        print(f"  phase {p}: {(t1 - t0) / 1e3:6.1f} ms, kernels {busy / 1e3:6.1f} ms, out {m[0] / MiB:6.0f} MiB ({m[2] / 1e3:5.1f} ms of events), in {m[1] / MiB:6.0f} MiB ({m[3] / 1e3:5.1f} ms)")


def kinds(pre, rec, S):
    step, phase, phase_at, made, freed = -1, None, [], {}, {}
    for r in st.iter_records(rec):
        n = type(r).__name__
        if n == "Step": step = r.step
        elif n == "Phase": phase = r.phase
        elif n == "Alloc": made[r.alloc] = (step, phase)
        elif n == "Free": freed[r.alloc] = (step, phase)
        elif n == "Launch" and step == S: phase_at.append(phase)
    span, who, ideal, blocks, launches = moves.load(pre, S)
    ev = moves.events(pre + ".shim.json")
    ks = sorted((e for e in ev if e.get("cat") == "kernel" and span[0] <= e["ts"] < span[1]), key=lambda e: e["ts"])
    kts = [e["ts"] for e in ks]
    def kind(i):
        m = made.get(i); f = freed.get(i)
        if m is None: return "?"
        if m[0] == -1: return "before step 0 (weights)"
        return f"made in step {m[0]} phase {m[1]}, " + (f"freed in step {f[0]} phase {f[1]}" if f else "never freed")
    c = collections.defaultdict(collections.Counter)
    for e, i in moves.spillway_moves(pre, span, who):
        L = max(0, bisect.bisect_right(kts, e["ts"]) - 1)
        c[(phase_at[min(L, len(phase_at) - 1)], "out" if e["name"].startswith("evict") else "in")][kind(i)] += e["args"]["bytes"]
    ic = collections.Counter()
    for i, ms in ideal.items():
        for m in ms: ic[kind(i)] += m["bytes"]
    print(pre, "step", S)
    for k in sorted(c): print(" ", k, {a: f"{b / MiB:.0f}" for a, b in c[k].most_common()})
    print("  the ideal's out, whole step:", {a: f"{b / MiB:.0f}" for a, b in ic.most_common()})


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] not in ("links", "kinds"):
        sys.exit(__doc__)
    (links if sys.argv[1] == "links" else kinds)(sys.argv[2], sys.argv[3], int(sys.argv[4]))
