"""harness/report.py and harness/demo.py on a tiny synthetic trace (pytest, run by
ctest as python_report with REPLAY_BIN_FOR_TESTS pointing at build/bin/spillway-replay).

The trace is a 2-layer "transformer" of 2 MiB activations over 3 steps, the
middle one 4x longer: its live set is several times the others', so a device
of 65% of the unconstrained peak runs the plain allocator out of memory there
while spillway can complete. All times involved are simulated."""

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "harness"))
import demo  # noqa: E402
import report  # noqa: E402
import spillway_record as st  # noqa: E402

REPLAY = Path(os.environ.get("REPLAY_BIN_FOR_TESTS", REPO / "build" / "bin" / "spillway-replay"))
pytestmark = pytest.mark.skipif(not REPLAY.exists(), reason=f"{REPLAY} not built")

MIB = 1 << 20


def write_trace(path: Path, lengths=(1, 4, 1), layers=2, act=2 * MIB):
    """Forward ramp (activations saved for backward), backward sawtooth, SGD-like update."""
    ids = iter(range(1, 1 << 30))
    with st.Writer(str(path), meta={"source": "test_report", "layers": layers}) as w:
        mm, bwd, upd = w.string("aten::mm"), w.string("aten::mm_backward"), w.string("aten::add_")
        weights = []
        for _ in range(layers):
            wid = next(ids)
            w.alloc(wid, act)
            w.launch(0, upd, 5000, [(wid, 0, act, st.WRITE)])
            weights.append(wid)
        for step, n in enumerate(lengths):
            w.step(step)
            w.phase(st.PHASE_FORWARD)
            size = act * n
            x = next(ids)
            w.alloc(x, size)
            w.launch(0, mm, 10000, [(x, 0, size, st.WRITE)])
            saved = [x]
            for wid in weights:
                y = next(ids)
                w.alloc(y, size)
                w.launch(0, mm, 20000 * n, [(saved[-1], 0, size, st.READ),
                                            (wid, 0, act, st.READ), (y, 0, size, st.WRITE)])
                saved.append(y)
            w.phase(st.PHASE_BACKWARD)
            g = next(ids)
            w.alloc(g, size)
            w.launch(0, bwd, 10000, [(saved[-1], 0, size, st.READ), (g, 0, size, st.WRITE)])
            for i in reversed(range(layers)):
                gx = next(ids)
                w.alloc(gx, size)
                w.launch(0, bwd, 40000 * n, [(g, 0, size, st.READ), (saved[i], 0, size, st.READ),
                                             (weights[i], 0, act, st.READ_WRITE),
                                             (gx, 0, size, st.WRITE)])
                w.free(g)
                w.free(saved[i + 1])
                g = gx
            w.free(g)
            w.free(saved[0])
            w.phase(st.PHASE_OTHER)
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_trace(tmp_path_factory.mktemp("trace") / "tiny.spwt")


def test_report_table_and_plots(tiny, tmp_path, capsys):
    out = tmp_path / "report"
    rc = report.main(["--traces", str(tiny), "--budgets", "100,60", "--strategies",
                      "spillway,none", "--out", str(out), "--replay", str(REPLAY)])
    assert rc == 0
    # Progress: each run finished says which of how many it is.
    err = capsys.readouterr().err
    assert [f"[{k}/4]" in err for k in range(1, 5)] == [True] * 4, err
    md = (out / "report.md").read_text()
    assert "SIMULATED" in md and report.TABLE_HEAD.splitlines()[0] in md
    rows = json.loads((out / "results.json").read_text())
    assert {(r["budget_label"], r["strategy"]) for r in rows} == {
        ("100%", "spillway"), ("100%", "none"), ("60%", "spillway"), ("60%", "none")}
    for r in rows:
        assert f"| tiny | {r['budget_label']} | {r['strategy']} |" in md
        assert r["integrity_ok"] is True
        last = report.last_step_ns(r)
        assert last == (None if r["oom"] else r["step_times_ns"][-1])
        assert f"| {report.fmt_ms(last)} |" in md
    by = {(r["budget_label"], r["strategy"]): r for r in rows}
    assert by["100%", "none"]["steps_completed"] == 3 and not by["100%", "none"]["oom"]
    assert by["60%", "none"]["oom"]
    assert by["60%", "spillway"]["steps_completed"] == 3
    assert by["60%", "spillway"]["peak_device_bytes"] <= by["60%", "spillway"]["budget_bytes"]
    # The ideal beside spillway's figures: nothing moves at 100%, some bytes
    # must at 60%, and the table prints the ratios the row's numbers give.
    full, tight = by["100%", "spillway"], by["60%", "spillway"]
    assert full["min_bytes_moved"] == 0 and tight["min_bytes_moved"] > 0
    assert tight["ideal_fits"] is True
    want = report.versus_ideal(tight)
    last, ideal = report.last_step_ns(tight), tight["ideal_step_time_ns"]
    assert want.startswith(f"{last / ideal:.2f}x, ")
    assert f"| {report.fmt_ms(ideal)} | {want} |" in md
    # Each step's bound, and the ideal's last step over the last one.
    bounds = tight["sim_lower_bound_step_times_ns"]
    assert len(bounds) == tight["steps_in_record"]
    assert sorted(bounds)[len(bounds) // 2] == tight["sim_lower_bound_step_time_ns"]
    assert f"| {want} | {ideal / bounds[-1]:.2f}x |" in md
    # The heaviest step: the middle one of this trace (4x longer), where the
    # ideal is slowest; the table gives spillway's over the ideal's there.
    ideals = tight["ideal_step_times_ns"]
    assert max(range(3), key=ideals.__getitem__) == 1
    heavy = tight["step_times_ns"][1] / ideals[1]
    assert f"| {ideal / bounds[-1]:.2f}x | {heavy:.2f}x (step 1) |" in md
    for png in ("memory_tiny_60.png", "overhead_tiny.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        assert f"({png})" in md
    # The timeline the memory plot draws: one sample per ALLOC/FREE served.
    tl = report.read_timeline(Path(by["60%", "spillway"]["chrome_trace"]))
    assert len(tl["t_ms"]) == len(report.live_curve(tiny)) and len(tl["steps"]) == 3
    assert tl["t_ms"] == sorted(tl["t_ms"])


def test_demo_checks(tiny, tmp_path):
    out = tmp_path / "demo"
    build = tmp_path / "build"
    (build / "bin").mkdir(parents=True)
    (build / "bin" / "spillway-replay").symlink_to(REPLAY)
    rc = demo.main(["--build", str(build), "--out", str(out), "--trace", str(tiny),
                    "--anchors", "torchtune"])
    s = json.loads((out / "summary.json").read_text())
    assert s["longest_step"] == 1
    assert s["baseline_oom_shown"] is True and s["baseline_oom_step"] == 1
    assert s["runs"]["none"]["oom"] is True
    assert s["spillway_completed"] is True
    sp = s["runs"]["spillway"]
    assert sp["integrity_ok"] is True and sp["steps_completed"] == sp["steps_in_record"] == 3
    assert sp["peak_device_bytes"] <= s["device_bytes"]
    assert rc == 0
    assert (out / "memory.png").read_bytes()[:4] == b"\x89PNG"
    for f in ("spillway.perfetto.json", "replay.perfetto.json"):
        doc = json.loads((out / f).read_text())  # JSON array or object form
        events = doc if isinstance(doc, list) else doc["traceEvents"]
        assert any(e.get("ph") == "C" for e in events), f


def test_demo_fails_when_the_baseline_fits(tiny, tmp_path):
    """Not 0 when the device is not smaller than the longest step needs (nothing to show)."""
    build = tmp_path / "build"
    (build / "bin").mkdir(parents=True)
    (build / "bin" / "spillway-replay").symlink_to(REPLAY)
    small = write_trace(tmp_path / "flat.spwt", lengths=(1, 1))
    rc = demo.main(["--build", str(build), "--out", str(tmp_path / "d"), "--trace", str(small),
                    "--anchors", "", "--fraction", "1.0"])
    assert rc != 0


def test_equal_peak_runs_spillway_at_each_anchors_peak(tiny, tmp_path, capsys):
    """--equal-peak: spillway's budget is each anchor's device peak at 100%,
    and the table compares them step by step (the numbers are the runs')."""
    out = tmp_path / "report"
    rc = report.main(["--traces", str(tiny), "--budgets", "100", "--strategies",
                      "spillway,torchtune,layerwise", "--out", str(out), "--replay", str(REPLAY),
                      "--equal-peak"])
    assert rc == 0
    pairs = json.loads((out / "equal_peak.json").read_text())
    assert sorted(p["anchor"]["strategy"] for p in pairs) == ["layerwise", "torchtune"]
    md = (out / "report.md").read_text()
    assert "## At equal peak memory" in md and report.EQUAL_PEAK_HEAD.splitlines()[0] in md
    for p in pairs:
        a, s = p["anchor"], p["spillway"]
        assert a["budget_pct"] == 100
        assert f"--budget {a['peak_device_bytes']}" in s["command"]
        assert s["budget_bytes"] == a["peak_device_bytes"]
        assert s["peak_device_bytes"] <= s["budget_bytes"]
        assert s["integrity_ok"] is True and s["steps_completed"] == 3
        faster = all(x < y for x, y in zip(s["step_times_ns"], a["step_times_ns"]))
        row = (f"| tiny | {a['strategy']} | {report.fmt_mib(a['peak_device_bytes'])} "
               f"| {report.fmt_mib(s['peak_device_bytes'])} | ok "
               f"| {report.fmt_ms(a['step_times_ns'][-1])} | {report.fmt_ms(s['step_times_ns'][-1])} ")
        assert row in md, md
        assert md.split(row)[1].split("\n")[0].endswith(f"| {'yes' if faster else 'no'} |")
    assert report.equal_peak_table(pairs) in capsys.readouterr().out


def test_equal_peak_needs_the_anchors_at_full_budget(tiny, tmp_path):
    with pytest.raises(SystemExit) as e:
        report.main(["--traces", str(tiny), "--budgets", "60", "--strategies",
                     "spillway,torchtune", "--out", str(tmp_path / "r"), "--replay", str(REPLAY),
                     "--equal-peak"])
    assert e.value.code == 2


def test_steady_state_is_the_median_of_the_last_half_against_the_ideals():
    # Eight steps: the last half (steps 4-7) is 10, 12, 30, 11 ms against an
    # ideal of 10 each; the median (11.5) over the ideal's: 1.15x, whatever
    # the first steps or the one slow step cost.
    ms = 1_000_000
    row = {"steps_in_record": 8, "oom": False,
           "step_times_ns": [90 * ms, 40 * ms, 20 * ms, 15 * ms, 10 * ms, 12 * ms, 30 * ms, 11 * ms],
           "ideal_step_times_ns": [20 * ms] + [10 * ms] * 7}
    assert report.steady_versus_ideal(row) == "1.15x (steps 4-7)"
    # The ideal's median over the cyclic bound's, same steps: 10 over 8.
    bounded = dict(row, sim_cyclic_bound_step_times_ns=[1 * ms] * 4 + [8 * ms, 9 * ms, 7 * ms, 8 * ms])
    assert report.steady_ideal_over_bound(bounded) == "1.25x"
    assert report.steady_ideal_over_bound(row) == "-"  # no bound reported
    # Odd counts take the middle one: steps 2-4 of five.
    five = dict(row, steps_in_record=5, step_times_ns=row["step_times_ns"][:5],
                ideal_step_times_ns=row["ideal_step_times_ns"][:5])
    assert report.steady_versus_ideal(five) == "1.50x (steps 2-4)"
    # No steady half: two or three steps, a run that stopped, an OOM.
    for bad in (dict(row, steps_in_record=2, step_times_ns=row["step_times_ns"][:2],
                     ideal_step_times_ns=row["ideal_step_times_ns"][:2]),
                dict(row, step_times_ns=row["step_times_ns"][:7]),
                dict(row, oom=True)):
        assert report.steady_versus_ideal(bad) == "-"


def test_report_prints_the_steady_column_for_a_record_of_repeating_steps(tmp_path, capsys):
    trace = write_trace(tmp_path / "six.spwt", lengths=(1, 1, 1, 1, 1, 1))
    out = tmp_path / "report"
    rc = report.main(["--traces", str(trace), "--budgets", "60", "--strategies", "spillway",
                      "--out", str(out), "--replay", str(REPLAY)])
    assert rc == 0
    (row,) = json.loads((out / "results.json").read_text())
    steps, ideal = row["step_times_ns"], row["ideal_step_times_ns"]
    assert len(steps) == len(ideal) == 6
    want = sorted(steps[3:])[1] / sorted(ideal[3:])[1]
    bounds = row["sim_cyclic_bound_step_times_ns"]
    assert len(bounds) == 6 and all(b > 0 for b in bounds)
    over = sorted(ideal[3:])[1] / sorted(bounds[3:])[1]
    assert over >= 1.0  # a bound: never above the ideal's plan of the repeated step
    moved = sum(row["step_bytes_device_to_host"][3:]) + sum(row["step_bytes_host_to_device"][3:])
    assert moved > 0  # at 60% the steady steps move
    # The per-step figures add up to the run's, as the replayer counts them.
    assert sum(row["step_bytes_device_to_host"]) == row["bytes_device_to_host"]
    assert sum(row["step_bytes_host_to_device"]) == row["bytes_host_to_device"]
    assert sum(row["ideal_step_bytes_moved"]) == row["min_bytes_moved"]
    bytes_ratio = moved / sum(row["ideal_step_bytes_moved"][3:])
    assert (f"| {want:.2f}x (steps 3-5) | {bytes_ratio:.2f}x (steps 3-5) | {over:.2f}x |"
            in (out / "report.md").read_text())


def test_steady_bytes_are_the_last_halfs_sums_against_the_ideals():
    # Eight steps: the first half moves much (learning), the last half
    # 30+20 + 25+25 + 20+30 + 40+10 = 200 MiB against the ideal's 4 x 40.
    mib = 1 << 20
    row = {"steps_in_record": 8, "oom": False,
           "step_bytes_device_to_host": [m * mib for m in (90, 80, 70, 60, 30, 25, 20, 40)],
           "step_bytes_host_to_device": [m * mib for m in (50, 60, 60, 60, 20, 25, 30, 10)],
           "ideal_step_bytes_moved": [m * mib for m in (10, 40, 40, 40, 40, 40, 40, 40)]}
    assert report.steady_bytes_versus_ideal(row) == "1.25x (steps 4-7)"
    # Nothing to move in the ideal's steps and nothing moved: at the ideal.
    none = dict(row, step_bytes_device_to_host=[0] * 8, step_bytes_host_to_device=[0] * 8,
                ideal_step_bytes_moved=[0] * 8)
    assert report.steady_bytes_versus_ideal(none) == "1.00x"
    assert report.steady_bytes_versus_ideal(dict(none, step_bytes_device_to_host=[1] * 8)) == "-"
    # No steady half, a run that stopped or ran out of memory, or a replayer
    # without the per-step figures.
    for bad in (dict(row, steps_in_record=3,
                     **{k: row[k][:3] for k in ("step_bytes_device_to_host",
                                                "step_bytes_host_to_device",
                                                "ideal_step_bytes_moved")}),
                dict(row, step_bytes_device_to_host=row["step_bytes_device_to_host"][:7]),
                dict(row, oom=True),
                {k: v for k, v in row.items() if k != "ideal_step_bytes_moved"}):
        assert report.steady_bytes_versus_ideal(bad) == "-"


def test_report_with_lp_bound_prints_the_ideal_over_it(tmp_path):
    trace = write_trace(tmp_path / "six.spwt", lengths=(1, 1, 1, 1, 1, 1))
    out = tmp_path / "report"
    rc = report.main(["--traces", str(trace), "--budgets", "60", "--strategies", "spillway",
                      "--out", str(out), "--replay", str(REPLAY), "--lp-bound"])
    assert rc == 0
    (row,) = json.loads((out / "results.json").read_text())
    lp = row["lp_bound"]
    assert lp["steps"] == [3, 5]
    bound = max(lp["per_step_ns"], row["sim_baseline_step_time_ns"])
    ideal = sum(row["ideal_step_times_ns"][3:]) / 3
    assert ideal >= bound  # a bound on any plan of the ideal's class over those steps
    assert f"| {ideal / bound:.2f}x |" in (out / "report.md").read_text()
    # Without --lp-bound the column is empty.
    assert report.steady_over_lp_bound(dict(row, lp_bound=None)) == "-"


def test_a_budget_the_lp_cannot_meet_leaves_the_column_empty(tmp_path, capsys):
    # A row whose budget no plan can meet (1 byte): the report goes on, says
    # why, and prints no ratio for it.
    trace = write_trace(tmp_path / "six.spwt", lengths=(1, 1, 1, 1, 1, 1))
    row = {"strategy": "spillway", "steps_in_record": 6, "oom": False, "budget_pct": 60,
           "record": str(trace), "budget_bytes": 1, "trace_name": "six", "budget_label": "60%"}
    report.add_lp_bounds([row])
    assert "lp_bound" not in row
    assert "LP bound: six 60%: none (the budget cannot be met" in capsys.readouterr().err
    assert report.steady_over_lp_bound(row) == "-"


def test_runs_keep_the_median_run_and_every_runs_spread(tiny, tmp_path):
    out = tmp_path / "report"
    rc = report.main(["--traces", str(tiny), "--budgets", "60", "--strategies", "spillway,none",
                      "--runs", "3", "--out", str(out), "--replay", str(REPLAY)])
    assert rc == 0
    names = sorted(p.name for p in (out / "runs").glob("tiny_60_*.json")
                   if not p.name.endswith(".trace.json"))
    # spillway three times, the plain allocator (no background thread) once.
    assert names == ["tiny_60_none.json", "tiny_60_spillway_run0.json",
                     "tiny_60_spillway_run1.json", "tiny_60_spillway_run2.json"]
    rows = json.loads((out / "results.json").read_text())
    assert [r["strategy"] for r in rows] == ["spillway", "none"]
    row = rows[0]
    lasts = sorted(json.loads((out / "runs" / n).read_text())["step_times_ns"][-1]
                   for n in names[1:])
    assert report.last_step_ns(row) == lasts[1]  # the median run's own figures
    assert len(row["runs"]) == 3 and "runs" not in rows[1]
    times = sorted(x["ratios"][0] for x in row["runs"])
    assert times[1] == pytest.approx(report.last_step_ns(row) / row["ideal_step_time_ns"])
    col = report.over_runs(row)
    assert col.startswith(f"{times[1]:.2f}x [{times[0]:.2f}-{times[2]:.2f}], ")
    assert col.endswith("(3 runs)")
    assert f"| {col} |" in (out / "report.md").read_text()
    assert report.over_runs(rows[1]) == "-"


def test_runs_must_be_at_least_one(tiny, tmp_path):
    with pytest.raises(SystemExit) as e:
        report.main(["--traces", str(tiny), "--runs", "0", "--out", str(tmp_path),
                     "--replay", str(REPLAY)])
    assert e.value.code == 2


def test_the_last_step_against_the_ideal_without_foresight():
    mib = 1 << 20
    row = {"step_times_ns": [30, 12], "steps_in_record": 2, "oom": False,
           "step_bytes_device_to_host": [5 * mib, 3 * mib],
           "step_bytes_host_to_device": [1 * mib, 3 * mib],
           "ideal_without_foresight_last_step_ns": 10,
           "ideal_without_foresight_last_step_bytes_moved": 4 * mib,
           "ideal_without_foresight_fits": True}
    # The last step's 12 over 10; its 6 MiB moved over the plan's 4.
    assert report.versus_fresh(row) == "1.20x, 1.50x"
    assert report.versus_fresh({**row, "ideal_without_foresight_fits": False}) == \
        "1.20x, 1.50x (does not fit)"
    assert report.versus_fresh({**row, "oom": True}) == "-"
    del row["ideal_without_foresight_last_step_ns"]  # a replayer before session 33
    assert report.versus_fresh(row) == "-"
