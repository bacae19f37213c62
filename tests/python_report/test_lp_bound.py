"""harness/lp_bound.py: the LP bound on records worked by hand, its refusals,
and a committed record's bound against the replayer's ideal and spillway
(pytest; collected with test_report.py by ctest's python_report). Times are
simulated nanoseconds."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "harness"))
import lp_bound  # noqa: E402
import spillway_record as st  # noqa: E402

REPLAY = Path(os.environ.get("REPLAY_BIN_FOR_TESTS", REPO / "build" / "bin" / "spillway-replay"))
SANITIZED = bool(os.environ.get("SPW_TEST_SANITIZE"))
MB = 55_000_000  # a millisecond of one copy engine at 55 GB/s (55 bytes/ns)


def record(path, launches, sizes, frees_after=None, keep_bytes=True, granule=1):
    """One step of `launches` (duration ns, [(id, mode)]) each touching whole
    blocks, a block allocated just before its first launch; `sizes` {id:
    bytes}; `frees_after` {launch index: [ids]}. Loaded with exact sizes
    unless `granule` says otherwise."""
    frees_after = frees_after or {}
    with st.Writer(str(path), meta={"source": "test_lp_bound"}) as w:
        k = w.string("k")
        w.step(0)
        made = set()
        for n, (ns, touches) in enumerate(launches):
            for a, _ in touches:
                if a not in made:
                    w.alloc(a, sizes[a])
                    made.add(a)
            w.launch(0, k, ns, [(a, 0, sizes[a], mode) for a, mode in touches])
            for a in frees_after.get(n, []):
                w.free(a)
    return lp_bound.load(str(path), keep_bytes=keep_bytes, granule=granule)


def test_a_block_that_must_leave_in_a_short_window_stalls_by_the_copy_it_lacks(tmp_path):
    # X is written, then must be off while Y is in use (budget: one block),
    # then read. Its copy out takes 1 ms; the launch before Y's lasts 0.5 ms.
    rec = record(tmp_path / "a.spwt", [(500_000, [(1, st.WRITE)]), (1_000_000, [(2, st.WRITE)]),
                                      (1_000_000, [(1, st.READ)])],
                 {1: MB, 2: MB}, frees_after={1: [2]})
    r = lp_bound.bound(rec, MB, 0, 0)
    assert r["launch_ns"] == 2_500_000
    assert r["peak_demand_bytes"] == MB
    assert r["stall_ns"] == pytest.approx(500_000, rel=1e-6)
    assert r["bound_ns"] == pytest.approx(3_000_000, rel=1e-6)
    # With a window of 1 ms before Y, the copy fits: no stall.
    rec = record(tmp_path / "b.spwt", [(1_000_000, [(1, st.WRITE)]), (1_000_000, [(2, st.WRITE)]),
                                      (1_000_000, [(1, st.READ)])],
                 {1: MB, 2: MB}, frees_after={1: [2]})
    assert lp_bound.bound(rec, MB, 0, 0)["stall_ns"] == pytest.approx(0, abs=1)


def test_the_return_has_to_land_before_the_next_sample_point(tmp_path):
    # X leaves over a long window (2 ms) and comes back in the slot from Y's
    # launch to the step's end: 0.25 + 0.1 ms for a 1 ms copy, so 0.65 ms of
    # stall. (The slot holding X's next use counts whole: a relaxation.)
    rec = record(tmp_path / "a.spwt", [(2_000_000, [(1, st.WRITE)]), (250_000, [(2, st.WRITE)]),
                                      (100_000, [(1, st.READ)])],
                 {1: MB, 2: MB}, frees_after={1: [2]})
    r = lp_bound.bound(rec, MB, 0, 0)
    assert r["stall_ns"] == pytest.approx(650_000, rel=1e-6)


def test_bytes_never_read_again_are_copied_out_unless_the_plan_may_drop_them(tmp_path):
    # X is freed after Y's launch, unread since its write: a byte-keeping
    # plan copies it out in the 0.1 ms before Y (0.9 ms of stall) and never
    # back; a plan that knows the future drops it.
    launches = [(100_000, [(1, st.WRITE)]), (100_000, [(2, st.WRITE)]), (100_000, [(2, st.READ)])]
    rec = record(tmp_path / "a.spwt", launches, {1: MB, 2: MB}, frees_after={1: [1]})
    assert lp_bound.bound(rec, MB, 0, 0)["stall_ns"] == pytest.approx(900_000, rel=1e-6)
    rec = record(tmp_path / "a.spwt", launches, {1: MB, 2: MB}, frees_after={1: [1]},
                 keep_bytes=False)
    assert lp_bound.bound(rec, MB, 0, 0)["peak_demand_bytes"] == 0
    # X wholly written again before its read: kept, it goes out and comes
    # back (0.9 ms out before Y, 0.7 ms back in the 0.3 ms after); dropped,
    # no demand at all.
    launches = [(100_000, [(1, st.WRITE)]), (100_000, [(2, st.WRITE)]),
                (100_000, [(1, st.WRITE)]), (100_000, [(1, st.READ)])]
    rec = record(tmp_path / "b.spwt", launches, {1: MB, 2: MB}, frees_after={1: [2]})
    assert lp_bound.bound(rec, MB, 0, 0)["stall_ns"] == pytest.approx(1_600_000, rel=1e-6)
    rec = record(tmp_path / "b.spwt", launches, {1: MB, 2: MB}, frees_after={1: [2]},
                 keep_bytes=False)
    assert lp_bound.bound(rec, MB, 0, 0)["peak_demand_bytes"] == 0


def test_blocks_under_the_smallest_movable_size_never_leave(tmp_path):
    launches = [(100_000, [(1, st.WRITE)]), (100_000, [(2, st.WRITE)]), (100_000, [(1, st.READ)])]
    rec = record(tmp_path / "c.spwt", launches, {1: 1000, 2: 1000})
    with pytest.raises(ValueError, match="cannot be met"):
        lp_bound.bound(rec, 1000, 0, 0)
    assert lp_bound.bound(rec, 1000, 0, 0, min_block=1)["stall_ns"] == pytest.approx(0, abs=1)


def test_both_directions_share_the_link_as_the_simulator_places_copies(tmp_path):
    # In the one slot before Z's launch, X must leave (Z takes its room) and
    # W must return (Z reads it): 1 ms of copy each way in a 1 ms slot. The
    # simulator keeps the first copy at its solo rate (55) and runs the
    # other at the bidirectional one (45) while both run: 110 MB at 100 MB/ms
    # together, 0.1 ms of stall; with a bidirectional rate of 55, none.
    rec = record(tmp_path / "a.spwt",
                 [(1_000_000, [(1, st.WRITE), (3, st.WRITE)]),  # X=1, W=3 written
                  (1_000_000, [(2, st.WRITE), (1, st.READ)]),  # Y holds W's room; X last read
                  (1_000_000, [(4, st.WRITE), (3, st.READ)]),  # Z needs W back and X off
                  (1_000_000, [(1, st.READ)])],
                 {1: MB, 2: MB, 3: MB, 4: MB}, frees_after={1: [2], 2: [3, 4]})
    fast = lp_bound.bound(rec, 2 * MB, 0, 0, bidir=55.0)
    shared = lp_bound.bound(rec, 2 * MB, 0, 0, bidir=45.0)
    assert fast["stall_ns"] == pytest.approx(0, abs=1)
    assert shared["stall_ns"] == pytest.approx(100_000, rel=1e-3)


def test_the_command_refuses_a_bad_window(tmp_path, capsys):
    path = tmp_path / "a.spwt"
    record(path, [(100_000, [(1, st.WRITE)])], {1: MB})
    with pytest.raises(SystemExit):
        lp_bound.main([str(path), "--budget", "1", "--steps", "x"])
    assert "--steps 'x': expected A-B" in capsys.readouterr().err
    assert lp_bound.main([str(path), "--budget", "1", "--steps", "0-3"]) == 2
    assert "the record has steps 0-0" in capsys.readouterr().err


@pytest.mark.skipif(not REPLAY.exists(), reason=f"{REPLAY} not built")
@pytest.mark.skipif(SANITIZED, reason="a committed record's replay is for the plain build")
def test_a_committed_records_bound_is_under_the_ideal_and_spillway(tmp_path):
    """resnet50's eight steps at 40%: the bound of its last half holds for
    any plan of the ideal's class (blocks in whole granules), so for the
    replayer's ideal; with exact sizes (packed blocks, as spillway's split
    blocks may be) for spillway's own steps."""
    rec_path = REPO / "harness" / "records" / "resnet50_8steps.spwt"
    out = tmp_path / "r.json"
    subprocess.run([str(REPLAY), str(rec_path), "--budget", "40%", "--no-data", "--json", str(out)],
                   check=True, capture_output=True)
    rep = json.loads(out.read_text())
    granules = lp_bound.bound(lp_bound.load(str(rec_path)), rep["budget_bytes"], 4, 7)
    exact = lp_bound.bound(lp_bound.load(str(rec_path), granule=1), rep["budget_bytes"], 4, 7)
    assert 0 < exact["stall_ns"] < granules["stall_ns"]  # rounding up takes room
    assert granules["bound_ns"] <= sum(rep["ideal_step_times_ns"][4:8])
    assert exact["bound_ns"] <= sum(rep["step_times_ns"][4:8])


def test_granules_round_large_blocks_up(tmp_path):
    # Two blocks of 1.5 MiB in a budget of 3 MiB: exact, nothing moves; in
    # 2 MiB granules they take 4 MiB and one must leave.
    mib = 1 << 20
    launches = [(100_000, [(1, st.WRITE)]), (100_000, [(2, st.WRITE)]),
                (100_000, [(1, st.READ), (2, st.READ)])]
    sizes = {1: 3 * mib // 2, 2: 3 * mib // 2}
    rounded = record(tmp_path / "a.spwt", launches, sizes, granule=2 * mib)
    with pytest.raises(ValueError, match="cannot be met"):  # both in use at the last launch
        lp_bound.bound(rounded, 3 * mib, 0, 0)
    exact = record(tmp_path / "a.spwt", launches, sizes)
    assert lp_bound.bound(exact, 3 * mib, 0, 0)["peak_demand_bytes"] == 0


def test_packed_tails_stay_resident_and_whole_granules_move(tmp_path):
    # X of 3 MiB, then Y of 2 MiB, in a budget of 4 MiB; X is read after Y.
    # In whole granules X takes 4 MiB: all of it must leave for Y. Packed, X
    # moves its one whole granule and keeps its 1 MiB tail: 2 MiB leave.
    mib = 1 << 20
    launches = [(1_000_000, [(1, st.WRITE)]), (1_000_000, [(2, st.WRITE)]),
                (1_000_000, [(1, st.READ)])]
    path = tmp_path / "a.spwt"
    record(path, launches, {1: 3 * mib, 2: 2 * mib}, frees_after={1: [2]})
    whole = lp_bound.bound(lp_bound.load(str(path)), 4 * mib, 0, 0)
    packed = lp_bound.bound(lp_bound.load(str(path), pack_tails=True), 4 * mib, 0, 0)
    assert whole["peak_demand_bytes"] == 2 * mib  # 4 + 2 - 4
    assert packed["peak_demand_bytes"] == 1 * mib  # 3 + 2 - 4, from X's movable granule
    # Only whole granules move: with the 1 MiB granule, X leaves whole.
    rec = lp_bound.load(str(path), granule=1 << 20, pack_tails=True)
    assert lp_bound.bound(rec, 4 * mib, 0, 0)["peak_demand_bytes"] == 1 * mib
    # Packed, the tail counts where X is in use: 3 MiB at its read.
    with pytest.raises(ValueError, match="cannot be met"):
        lp_bound.bound(lp_bound.load(str(path), pack_tails=True), 5 * mib // 2, 0, 0)
