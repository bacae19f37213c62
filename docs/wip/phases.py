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


def read_step(pre, rec, S):
    """Step S of the record (each launch's phase; each allocation's step and
    phase made and freed) and of the replay (moves.load's view, the step's
    kernels in time order) with a copy's phase: that of the last kernel
    started before it (kernels in order are the launches in order)."""
    step, phase, phase_at, made, freed = -1, None, [], {}, {}
    for r in st.iter_records(rec):
        n = type(r).__name__
        if n == "Step": step = r.step
        elif n == "Phase": phase = r.phase
        elif n == "Alloc": made[r.alloc] = (step, phase)
        elif n == "Free": freed[r.alloc] = (step, phase)
        elif n == "Launch" and step == S: phase_at.append(phase)
    span, who, ideal, _, _ = moves.load(pre, S)
    ks = sorted((e for e in moves.events(pre + ".shim.json")
                 if e.get("cat") == "kernel" and span[0] <= e["ts"] < span[1]), key=lambda e: e["ts"])
    kts = [e["ts"] for e in ks]

    def phase_of(ts):
        return phase_at[min(max(0, bisect.bisect_right(kts, ts) - 1), len(phase_at) - 1)]
    return dict(span=span, who=who, ideal=ideal, kernels=ks, phase_of=phase_of, made=made, freed=freed)


def links(pre, rec, S):
    d = read_step(pre, rec, S)
    span, phase_of = d["span"], d["phase_of"]
    bounds = {}  # phase: [start, end, kernels busy]; a phase runs to the next one's first kernel
    for e in d["kernels"]:
        b = bounds.setdefault(phase_of(e["ts"]), [e["ts"], span[1], 0.0])
        b[2] += e["dur"]
    ph = sorted(bounds)
    for k, p in enumerate(ph[:-1]):
        bounds[p][1] = bounds[ph[k + 1]][0]
    bounds[ph[0]][0] = span[0]
    mv = collections.defaultdict(lambda: [0, 0, 0.0, 0.0])
    for e, i in moves.spillway_moves(pre, span, d["who"]):
        out = e["name"].startswith("evict")
        m = mv[phase_of(e["ts"])]
        m[0 if out else 1] += e["args"]["bytes"]
        m[2 if out else 3] += e["dur"]
    print(f"{pre} step {S}: {(span[1] - span[0]) / 1e3:.0f} ms")
    for p in ph:
        t0, t1, busy = bounds[p]; m = mv[p]
        print(f"  phase {p}: {(t1 - t0) / 1e3:6.1f} ms, kernels {busy / 1e3:6.1f} ms, out {m[0] / MiB:6.0f} MiB ({m[2] / 1e3:5.1f} ms of events), in {m[1] / MiB:6.0f} MiB ({m[3] / 1e3:5.1f} ms)")


def kinds(pre, rec, S):
    d = read_step(pre, rec, S)

    def kind(i):
        m = d["made"].get(i); f = d["freed"].get(i)
        if m is None: return "?"
        if m[0] == -1: return "before step 0 (weights)"
        return f"made in step {m[0]} phase {m[1]}, " + (f"freed in step {f[0]} phase {f[1]}" if f else "never freed")
    c = collections.defaultdict(collections.Counter)
    for e, i in moves.spillway_moves(pre, d["span"], d["who"]):
        c[(d["phase_of"](e["ts"]), "out" if e["name"].startswith("evict") else "in")][kind(i)] += e["args"]["bytes"]
    ic = collections.Counter()
    for i, ms in d["ideal"].items():
        for m in ms: ic[kind(i)] += m["bytes"]
    print(pre, "step", S)
    for k in sorted(c): print(" ", k, {a: f"{b / MiB:.0f}" for a, b in c[k].most_common()})
    print("  the ideal's out, whole step:", {a: f"{b / MiB:.0f}" for a, b in ic.most_common()})


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] not in ("links", "kinds"):
        sys.exit(__doc__)
    (links if sys.argv[1] == "links" else kinds)(sys.argv[2], sys.argv[3], int(sys.argv[4]))
