#!/usr/bin/env python3
"""A lower bound on the time a window of steps can take under a budget: the
linear relaxation of every plan (docs/performance.md, "The LP bound").

    lp_bound.py RECORD (--budget BYTES | --replay-json REPLAY.json) [--steps A-B]
        [--points 50] [--min-block 1048576] [--granule 2097152] [--pack-tails] [--drop-dead]
        [--json OUT]

Any plan that keeps the job within the budget, moving blocks of --min-block
bytes or more, each in whole --granule (spillway's and the replayer's
ideal's class: a large block is one mapping of its own), and keeping
every byte of a block until its free (spillway's contract: it moves bytes
only by copying them; --drop-dead: plans that drop bytes never read again),
has for every step window a schedule that this linear program accepts, so
its optimum is a lower bound on the window's time (simulated: the record's
launch durations at the simulator's copy rates). The program, per window:

- demand: at sample points (the launch of highest demand in each of
  --points spans of equal launch time per step), the bytes that must be off
  the device: those live (--drop-dead: those read again before a whole
  write or their free; blocks live at the record's end count as read
  again), plus those the launch touches, less the budget;
- supply: each interval between two accesses of a movable block (from its
  allocation, to its free; a gap) may be off at the points inside it, by
  any fraction; the gap before its free needs no copy back;
- links: the points cut the window into slots; a slot lasts its launches'
  durations plus a stall (>= 0, the variable minimized). What leaves the
  device in a slot, o, and what returns, i, fit the copy engines: o and i
  each at most the solo rate times the slot, o + i at most the faster solo
  rate plus SIMCUDA_BIDIR_GBPS times it (the simulator keeps a copy's rate
  once placed, so the first of two opposite copies runs at the solo rate);
- a gap's off amount changes only by what leaves and returns in each slot;
  it starts at 0 (or anything, for a gap open at the window's start: the
  window does not pay for what an earlier step moved) and is 0 at its block's
  next use.

Why it is a relaxation: blocks are divisible, a copy may start before its
block's last use in the slot that holds it, demands are checked at the
sample points only, the host's costs (launches, VMM calls) and the record's
own copies are not charged. So a plan's window time is at least the
launches' time plus the minimal stall. The bound for a repeated step: the
window of the last half of the record's steps, divided by its steps.

Needs scipy (HiGHS); every time it reports is simulated.
"""
from __future__ import annotations

import argparse
import bisect
import collections
import json
import os
import sys
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spillway_record as st  # noqa: E402

READ, PARTIAL, WHOLE = 0, 1, 2
# The program's units, so that HiGHS sees numbers near 1: bytes in MiB,
# stalls in microseconds.
MIB, US = float(1 << 20), 1e3


@dataclass
class Record:
    """What the bound needs of a record: per event its step, whether it is a
    launch and its duration; the bytes each event touches; the gaps (an
    access or the allocation, the next access or the free or the record's
    end, size, whether the block must be back at the gap's end); and per
    event the bytes in a gap strictly around it (`needed`)."""
    step_of: list = field(default_factory=list)
    launch_ns: list = field(default_factory=list)  # 0 for an event that is not a launch
    is_launch: list = field(default_factory=list)
    touched: list = field(default_factory=list)
    gaps: list = field(default_factory=list)
    needed: list = field(default_factory=list)
    steps: int = 0


def load(path: str, keep_bytes: bool = True, granule: int = 2 << 20,
         min_block: int = 1 << 20, pack_tails: bool = False) -> Record:
    """The record at `path`. keep_bytes: the class of plans that keep every
    byte of a block until its free (spillway's contract: it cannot know that
    a block will not be read, so it moves bytes only by copying them);
    False: plans that know the future and drop bytes never read again (a
    block after its last read, before a whole write of it) at no cost.
    Blocks of min_block bytes or more hold a whole number of granules, as
    each of spillway's large blocks is its own mapping (the replayer's ideal
    counts them so too); granule 1: exact sizes, plans that pack blocks.
    pack_tails: a design that packs blocks: a block of a granule or more
    moves its whole granules and keeps the rest (under a granule, sharing a
    granule with other blocks' tails) resident; smaller ones as above."""
    meta, recs = st.read(path)
    kinds, launch_at = [], []
    for r in recs:
        if isinstance(r, st.Duration):
            k = launch_at[r.launch]
            kinds[k] = kinds[k]._replace(duration_ns=r.duration_ns)
        elif isinstance(r, st.Launch):
            launch_at.append(len(kinds))
            kinds.append(r)
        elif isinstance(r, (st.Copy, st.Alloc, st.Free, st.Step)):
            kinds.append(r)
    rec = Record()
    n = len(kinds)
    step = -1
    size, accesses, born = {}, {}, {}  # live block -> its size, accesses [(event, kind)], alloc
    tails = {}  # live block -> its tail packed with others' (pack_tails)
    exact = {}  # live block -> its size before rounding (what a whole write covers)
    done = []  # (size, accesses, live at the end, alloc event, free event, packed tail)
    rec.touched = [0] * n
    for i, r in enumerate(kinds):
        if isinstance(r, st.Step):
            step += 1
        rec.step_of.append(step)
        rec.is_launch.append(isinstance(r, st.Launch))
        rec.launch_ns.append(r.duration_ns if isinstance(r, st.Launch) else 0)
        if isinstance(r, st.Alloc):
            sz = r.size
            if sz >= min_block and granule > 1:
                if pack_tails and sz >= granule:
                    tails[r.alloc] = sz % granule
                    sz -= tails[r.alloc]
                else:
                    sz = -(-sz // granule) * granule
            size[r.alloc], accesses[r.alloc], born[r.alloc] = sz, [], i
            exact[r.alloc] = r.size
        elif isinstance(r, st.Free):
            if r.alloc in size:
                done.append((size.pop(r.alloc), accesses.pop(r.alloc), False, born.pop(r.alloc), i,
                             tails.pop(r.alloc, 0)))
                del exact[r.alloc]
        elif isinstance(r, (st.Launch, st.Copy)):
            kind = {}
            if isinstance(r, st.Launch):
                spans = [(t.alloc, t.offset, t.length, t.mode) for t in r.touches]
            else:
                spans = []
                if r.dst.alloc:
                    spans.append((r.dst.alloc, r.dst.offset, r.bytes, st.WRITE))
                if r.src.alloc:
                    spans.append((r.src.alloc, r.src.offset, r.bytes, st.READ))
            for a, off, length, mode in spans:
                if a not in size:
                    continue
                if mode != st.WRITE:  # read, read-write, unknown: its bytes are read
                    k = READ
                elif off == 0 and length >= exact[a]:
                    k = WHOLE
                else:
                    k = PARTIAL
                kind[a] = min(kind.get(a, k), k)  # a read wins, then a partial write
            for a, k in kind.items():
                rec.touched[i] += size[a] + tails.get(a, 0)
                accesses[a].append((i, k))
    for a in size:
        done.append((size[a], accesses[a], True, born[a], n, tails.get(a, 0)))
    rec.steps = step + 1
    diff = [0] * (n + 1)

    def gap(u, v, sz, returns, tail=0):
        rec.gaps.append((u, v, sz, returns))
        diff[u + 1] += sz + tail  # a packed tail is live with its block, never moved
        diff[v] -= sz + tail

    for sz, acc, live_at_end, alloc, free, tail in done:
        if keep_bytes:
            # Every byte kept until its free: between two accesses (or the
            # allocation and the first) the block is resident or copied
            # out and back; after its last access it is resident or copied
            # out until its free; live at the end, it is needed again.
            marks = [alloc] + [i for i, _ in acc]
            for u, v in zip(marks, marks[1:]):
                if v - u > 1:
                    gap(u, v, sz, True, tail)
            end = n if live_at_end else free
            if end - marks[-1] > 1:
                gap(marks[-1], end, sz, live_at_end, tail)
            continue
        # Only bytes read again kept: a gap after access k is needed when,
        # going on, a read comes before a whole write or the free (or the
        # block is live at the end); other bytes are dropped at no cost.
        need = live_at_end
        nxt = n
        for i, k in reversed(acc):
            if need and nxt - i > 1:
                gap(i, nxt, sz, True, tail)
            if k == READ:
                need = True
            elif k == WHOLE:
                need = False
            nxt = i
    run = 0
    for i in range(n):
        run += diff[i]
        rec.needed.append(run)
    return rec


def bound(rec: Record, budget: int, first: int, last: int, points: int = 50,
          min_block: int = 1 << 20, d2h=55.0, h2d=55.0, bidir=45.0) -> dict:
    """The LP bound of steps first..last (inclusive): a dict of the window's
    launch time, the least stall, their sum and the sum per step (ns)."""
    import numpy as np
    import scipy.sparse as sp
    from scipy.optimize import linprog

    if not 0 <= first <= last < rec.steps:
        raise ValueError(f"steps {first}-{last}: the record has steps 0-{rec.steps - 1}")
    ev = [i for i, s in enumerate(rec.step_of) if first <= s <= last]
    w0, w1 = ev[0], ev[-1] + 1
    demand = [max(0, rec.needed[i] + rec.touched[i] - budget) if rec.is_launch[i] else 0
              for i in range(len(rec.step_of))]
    pts = []
    for s in range(first, last + 1):
        launches = [i for i in range(w0, w1) if rec.step_of[i] == s and rec.is_launch[i]]
        total = sum(rec.launch_ns[i] for i in launches)
        span, acc, cut = [], 0, 1
        for i in launches:
            span.append(i)
            acc += rec.launch_ns[i]
            if acc * points >= total * cut or i == launches[-1]:
                top = max(span, key=lambda q: demand[q])
                if demand[top] > 0:
                    pts.append(top)
                span, cut = [], cut + 1
    pts = sorted(set(pts))
    window_ns = sum(rec.launch_ns[w0:w1])
    out = {"steps": [first, last], "points": len(pts), "launch_ns": window_ns,
           "peak_demand_bytes": max((demand[p] for p in pts), default=0)}
    if not pts:
        out.update(stall_ns=0.0, bound_ns=float(window_ns), per_step_ns=window_ns / (last - first + 1))
        return out
    m = len(pts)
    edges = [w0] + pts + [w1]
    slot_ns = [sum(rec.launch_ns[edges[j]:edges[j + 1]]) for j in range(m + 1)]  # slot j ends at point j

    # Gaps with the same slots are one variable group: the program cannot tell them apart.
    groups = collections.defaultdict(int)
    for u, v, sz, returns in rec.gaps:
        if sz < min_block:
            continue
        a = bisect.bisect_right(pts, u)  # the first point after u
        b = bisect.bisect_left(pts, v)   # the first point at or after v
        if a < b:  # open at the end: no return within the window
            groups[(a, b, u < w0, v >= w1 or not returns)] += sz

    ub, cov, outs, ins = [], collections.defaultdict(list), collections.defaultdict(list), \
        collections.defaultdict(list)
    eq_r, eq_c, eq_v = [], [], []

    def var(hi):
        ub.append(hi)
        return len(ub) - 1

    rows = 0
    for (a, b, open_start, open_end), sz in groups.items():
        off = {j: var(sz / MIB) for j in range(a, b)}
        for j, x in off.items():
            cov[j].append(x)
        prev = var(sz / MIB) if open_start else None
        for j in range(a, b + 1):
            if j == b and open_end:
                break  # no return inside the window
            o, i_ = var(np.inf), var(np.inf)
            outs[j].append(o)
            ins[j].append(i_)
            # off_j = off_{j-1} + out_j - in_j (off is 0 at the next use)
            terms = [(o, -1.0), (i_, 1.0)]
            if j in off:
                terms.append((off[j], 1.0))
            if prev is not None:
                terms.append((prev, -1.0))
            for c, v in terms:
                eq_r.append(rows)
                eq_c.append(c)
                eq_v.append(v)
            rows += 1
            prev = off.get(j)
    stall = [var(np.inf) for _ in range(m + 1)]
    n = len(ub)
    a_r, a_c, a_v, a_b = [], [], [], []
    row = 0
    # The copy engines' region per slot of length T: o <= d2h T, i <= h2d T,
    # and o + i <= (solo + bidir) T. The simulator places a copy for good
    # when it is enqueued (docs/sim.md): one placed while the other engine
    # is idle keeps its solo rate even if an opposite copy starts later and
    # runs at the bidirectional rate, so both directions together may reach
    # the faster solo rate plus the bidirectional one, not twice the latter.
    lines = [(1.0, 0.0, d2h), (0.0, 1.0, h2d)]
    if bidir < min(d2h, h2d):
        lines.append((1.0, 1.0, max(d2h, h2d) + bidir))
    for j in range(m + 1):
        if not outs[j] and not ins[j]:
            continue
        for co, ci, rate in lines:
            for x in outs[j]:
                if co:
                    a_r.append(row), a_c.append(x), a_v.append(co)
            for x in ins[j]:
                if ci:
                    a_r.append(row), a_c.append(x), a_v.append(ci)
            a_r.append(row), a_c.append(stall[j]), a_v.append(-rate * US / MIB)
            a_b.append(rate * slot_ns[j] / MIB)
            row += 1
    for j in range(m):
        for x in cov[j]:
            a_r.append(row), a_c.append(x), a_v.append(-1.0)
        a_b.append(-demand[pts[j]] / MIB)
        row += 1
    c = np.zeros(n)
    c[stall] = 1.0
    res = linprog(c, A_ub=sp.csr_matrix((a_v, (a_r, a_c)), shape=(row, n)), b_ub=a_b,
                  A_eq=sp.csr_matrix((eq_v, (eq_r, eq_c)), shape=(rows, n)), b_eq=[0.0] * rows,
                  bounds=list(zip([0.0] * n, ub)), method="highs")
    if res.status == 2:
        raise ValueError("the budget cannot be met: at some launch the movable blocks that are "
                         "not in use are fewer than the bytes over the budget")
    if res.status != 0:
        raise RuntimeError(f"the linear program did not solve: {res.message}")
    stall_ns = float(res.fun) * US
    out.update(stall_ns=stall_ns, bound_ns=window_ns + stall_ns,
               per_step_ns=(window_ns + stall_ns) / (last - first + 1))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("record")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--budget", type=int, help="the budget in bytes")
    g.add_argument("--replay-json", help="a spillway-replay --json report: its budget_bytes")
    ap.add_argument("--steps", default="", help="A-B, the window (default: the last half)")
    ap.add_argument("--points", type=int, default=50, help="sample points per step")
    ap.add_argument("--min-block", type=int, default=1 << 20,
                    help="the smallest movable block (SPILLWAY_MIN_BLOCK's default)")
    ap.add_argument("--granule", type=int, default=2 << 20,
                    help="blocks of --min-block or more take whole granules (1: exact sizes)")
    ap.add_argument("--pack-tails", action="store_true",
                    help="blocks of a granule or more move their whole granules, their tails "
                         "stay resident, packed (a design that packs blocks)")
    ap.add_argument("--drop-dead", action="store_true",
                    help="plans that drop bytes never read again at no cost (default: every byte "
                         "kept until its free, spillway's contract)")
    ap.add_argument("--json", default="", help="write the result here")
    args = ap.parse_args(argv)
    if args.points < 1:
        ap.error("--points must be 1 or more")
    budget = args.budget
    if args.replay_json:
        with open(args.replay_json) as f:
            budget = json.load(f)["budget_bytes"]
    if args.granule < 1 or args.min_block < 1:
        ap.error("--granule and --min-block must be 1 or more")
    rec = load(args.record, keep_bytes=not args.drop_dead, granule=args.granule,
               min_block=args.min_block, pack_tails=args.pack_tails)
    if args.steps:
        try:
            first, last = (int(x) for x in args.steps.split("-"))
        except ValueError:
            ap.error(f"--steps {args.steps!r}: expected A-B, two step numbers")
    else:
        first, last = rec.steps // 2, rec.steps - 1
    rates = {k: float(os.environ.get(f"SIMCUDA_{k.upper()}_GBPS", d))
             for k, d in (("d2h", 55), ("h2d", 55), ("bidir", 45))}
    try:
        r = bound(rec, budget, first, last, args.points, args.min_block, **rates)
    except ValueError as e:
        print(f"lp_bound: {e}", file=sys.stderr)
        return 2
    r.update(record=args.record, budget_bytes=budget, keep_bytes=not args.drop_dead,
             time_units="simulated nanoseconds")
    print(f"lp_bound: {args.record} at {budget} bytes, steps {first}-{last} (simulated): "
          f"launches {r['launch_ns'] / 1e6:.3f} ms, stall >= {r['stall_ns'] / 1e6:.3f} ms; "
          f"a step >= {r['per_step_ns'] / 1e6:.3f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
