#!/usr/bin/python3
"""Replay a matrix of records x budgets x strategies and report it.

    /usr/bin/python3 harness/report.py [--records gpt_varlen,resnet50,vit_b16]
        [--budgets 100,60,40] [--strategies spillway,none,save_on_cpu,torchtune,layerwise]
        [--out DIR] [--quick] [--no-data-records llama7b] [--replay PATH] [--jobs N]
        [--equal-peak]

Every run is `build/bin/spillway-replay RECORD --strategy S --device-memory B
[--budget B] --json ... --trace-out ...` (harness/README.md). A budget is a
percentage of the trace's unconstrained peak (the replayer's baseline: strategy
none, no memory limit), found first by one accounting-mode run; at budget B the
simulated device has exactly B bytes for every strategy, and strategy spillway
also gets B as its budget (SPILLWAY_GPU_BUDGET). So `none` at B is the plain
allocator on a device of B bytes: it runs out of memory where the job needs more.

Writes into DIR: `report.md` (the table and the plots), `results.json` (one row
per run: the replayer's JSON plus the run's command), `runs/` (each run's JSON
and Chrome trace), `memory_<trace>_<budget>.png` (resident device memory over
simulated time, one panel per strategy) and `overhead_<trace>.png` (median step
time relative to the baseline against the budget, the lower bound drawn in).

EVERY TIME HERE IS SIMULATED: the virtual clock of sim/ with its H100 cost
model (docs/sim.md), never wall-clock time.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRACE_DIR = REPO / "harness" / "records"
STRATEGIES = ["spillway", "none", "save_on_cpu", "torchtune", "layerwise"]
MIB = 1 << 20
SIM = "simulated"


def log(msg: str) -> None:
    print(f"report: {msg}", file=sys.stderr, flush=True)


def trace_path(name: str) -> Path:
    """A committed trace's name (gpt_varlen) or a path to a .spwt file."""
    p = Path(name)
    if p.suffix == ".spwt" or p.exists():
        return p.resolve()
    return TRACE_DIR / f"{name}.spwt"


def trace_label(path: Path) -> str:
    return path.stem


def budget_label(pct: float) -> str:
    return f"{pct:g}%"


class ReplayError(RuntimeError):
    pass


def replay(binary: Path, trace: Path, args: list[str], json_out: Path,
           trace_out: Path | None = None, env: dict | None = None,
           timeout: float = 1800) -> dict:
    """One spillway-replay run; returns its JSON report plus `command`, `exit`,
    `wall_s` (wall-clock seconds of the replay process, not simulated)."""
    cmd = [str(binary), str(trace), *args, "--json", str(json_out)]
    if trace_out is not None:
        cmd += ["--trace-out", str(trace_out)]
    json_out.parent.mkdir(parents=True, exist_ok=True)
    if json_out.exists():
        json_out.unlink()
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env={**os.environ, **(env or {})}, timeout=timeout)
    wall = time.monotonic() - t0
    if p.returncode == 2 or not json_out.exists():
        raise ReplayError(f"{shlex.join(cmd)} failed (exit {p.returncode}):\n"
                          f"{p.stderr[-3000:]}{p.stdout[-2000:]}")
    rep = json.loads(json_out.read_text())
    rep["command"] = shlex.join(cmd)
    rep["exit"] = p.returncode
    rep["wall_s"] = round(wall, 2)
    rep["stdout"] = p.stdout
    return rep


def unconstrained_peak(binary: Path, trace: Path, work: Path, no_data: bool = True,
                       steps: int | None = None) -> dict:
    """The replayer's unconstrained run (strategy none, no memory limit)."""
    args = ["--strategy", "none", "--no-data"]
    if steps is not None:
        args += ["--steps", str(steps)]
    return replay(binary, trace, args, work / f"{trace_label(trace)}_probe.json")


def run_args(strategy: str, device_bytes: int, no_data: bool, steps: int | None) -> list[str]:
    args = ["--strategy", strategy, "--device-memory", str(device_bytes)]
    if strategy == "spillway":
        args += ["--budget", str(device_bytes)]
    if no_data:
        args.append("--no-data")
    if steps is not None:
        args += ["--steps", str(steps)]
    return args


def read_timeline(chrome_trace: Path) -> dict:
    """Memory counter samples and step slices of the replayer's --trace-out.

    Returns {"t_ms": [...], "device": [...], "host": [...] (bytes),
    "steps": [(start_ms, end_ms), ...]}, all times simulated milliseconds."""
    doc = json.loads(chrome_trace.read_text())
    # The JSON Array Format since session 19 (the shim's), the Object Format before.
    events = doc if isinstance(doc, list) else doc.get("traceEvents", [])
    t, dev, host, steps = [], [], [], []
    for ev in events:
        if ev.get("ph") == "C" and ev.get("name") == "memory":
            t.append(ev["ts"] / 1e3)
            dev.append(ev["args"].get("device_bytes", 0))
            host.append(ev["args"].get("host_bytes", 0))
        elif ev.get("ph") == "X" and str(ev.get("name", "")).startswith("step"):
            steps.append((ev["ts"] / 1e3, (ev["ts"] + ev["dur"]) / 1e3))
    return {"t_ms": t, "device": dev, "host": host, "steps": steps}


_LIVE_CACHE: dict = {}


def live_curve(trace: Path) -> list[int]:
    """The job's live requested bytes after each ALLOC and FREE of the trace, in order.

    The replayer samples its memory counter once per ALLOC it served and once
    per FREE (strategies none and spillway: nothing else), so sample k is trace
    event k and this curve can be drawn on the run's simulated clock: the
    forward ramp and the backward sawtooth of what the job holds, whatever the
    allocator caches or spillway evicts."""
    key = str(trace)
    if key not in _LIVE_CACHE:
        sys.path.insert(0, str(REPO / "harness"))
        import spillway_record as st
        live, sizes, cur = [], {}, 0
        for r in st.iter_records(str(trace)):
            if isinstance(r, st.Alloc):
                sizes[r.alloc] = r.size
                cur += r.size
                live.append(cur)
            elif isinstance(r, st.Free):
                cur -= sizes.pop(r.alloc, 0)
                live.append(cur)
        _LIVE_CACHE[key] = live
    return _LIVE_CACHE[key]


# ---------------------------------------------------------------- table

def fmt_mib(b) -> str:
    return "-" if b is None else f"{b / MIB:.0f}"


def fmt_ms(ns) -> str:
    return "-" if not ns else f"{ns / 1e6:.2f}"


def overhead_pct(row: dict) -> float | None:
    if row.get("oom") or not row.get("sim_step_time_ns") or not row.get("sim_baseline_step_time_ns"):
        return None
    return 100.0 * (row["sim_step_time_ns"] / row["sim_baseline_step_time_ns"] - 1.0)


def integrity(row: dict) -> str:
    v = row.get("integrity_ok")
    if v is None:
        return "not checked"
    return "ok" if v else "FAILED"


TABLE_HEAD = ("| trace | budget | strategy | steps | OOM | integrity | peak / budget MiB "
              "| D2H / H2D MiB | step ms | last step ms | overhead | lower bound ms | stall ms "
              "| ideal last step ms | spillway / ideal (time, bytes) | ideal / last step's bound "
              "| heaviest step: spillway / ideal | steady: spillway / ideal | steady bytes: spillway / ideal "
              "| steady: ideal / cyclic bound | steady: ideal / LP bound "
              "| over the runs: spillway / ideal (time, bytes) "
              "| last step: spillway / ideal without foresight (time, its bytes) |\n"
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")


def bytes_ratio(moved: int, least: int | None) -> str:
    """Bytes moved over a plan's: 1.00x where neither moves any."""
    return f"{moved / least:.2f}x" if least else ("1.00x" if moved == 0 else "-")


def versus_ideal(row: dict) -> str:
    """The last step over the ideal's, and the bytes moved over the ideal's
    (harness/README.md: the planner given the trace's exact future)."""
    last, ideal = last_step_ns(row), row.get("ideal_step_time_ns")
    moved = row.get("bytes_device_to_host", 0) + row.get("bytes_host_to_device", 0)
    least = row.get("min_bytes_moved")
    if not last or not ideal:
        return "-"
    return f"{last / ideal:.2f}x, {bytes_ratio(moved, least)}"


def versus_fresh(row: dict) -> str:
    """The last step over the ideal without foresight's (the same step
    planned with nothing carried from the step before, replayer's
    `ideal_without_foresight_*`), time and that step's bytes: how much of
    the gap to the ideal is the cyclic plan's sight of the step before."""
    last, fresh = last_step_ns(row), row.get("ideal_without_foresight_last_step_ns")
    if not last or not fresh:
        return "-"
    moved = sum((row.get("step_bytes_device_to_host") or [0])[-1:]) + \
        sum((row.get("step_bytes_host_to_device") or [0])[-1:])
    least = row.get("ideal_without_foresight_last_step_bytes_moved")
    fits = "" if row.get("ideal_without_foresight_fits", True) else " (does not fit)"
    return f"{last / fresh:.2f}x, {bytes_ratio(moved, least)}{fits}"


def ideal_over_bound(row: dict) -> str:
    """The ideal's last step over that step's own lower bound (design.md
    section 9, `sim_lower_bound_step_times_ns`): how far the ideal may be
    from an optimum. Under 1.00x is possible, the formula is no strict bound
    for a cyclic plan (docs/residency.md, session 21)."""
    bounds, ideal = row.get("sim_lower_bound_step_times_ns"), row.get("ideal_step_time_ns")
    if not bounds or not ideal or not bounds[-1]:
        return "-"
    return f"{ideal / bounds[-1]:.2f}x"


def heaviest_step(row: dict) -> str:
    """spillway's step over the ideal's at the step where the ideal is
    slowest (the most pressure: gpt_varlen's long batch, where the last step
    is a short one), with its index."""
    ideal, steps = row.get("ideal_step_times_ns") or [], row.get("step_times_ns") or []
    if row.get("oom") or not ideal or len(ideal) != len(steps):
        return "-"
    i = max(range(len(ideal)), key=ideal.__getitem__)
    return f"{steps[i] / ideal[i]:.2f}x (step {i})"


def _median(xs: list[int]) -> float:
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def _steady_ratio(num: list[int], den: list[int]) -> float | None:
    """The median of `num`'s last half over `den`'s, both of the same steps
    (4 or more), or None."""
    n = len(num)
    if n < 4 or len(den) != n:
        return None
    d = _median(den[n // 2:])
    return _median(num[n // 2:]) / d if d else None


def steady_versus_ideal(row: dict) -> str:
    """spillway's median step over the ideal's median, both over the last
    half of the record's steps: the steady state of a record of repeating
    steps (4 or more), once the first steps' learning and the first plans'
    transition are behind, and without the last step's end alone. The ideal
    is cyclic (each step repeated), so this is its like for like; a two-step
    record's last step is the first spillway has seen (docs/residency.md,
    session 23)."""
    steps = row.get("step_times_ns") or []
    if row.get("oom") or len(steps) != row.get("steps_in_record"):
        return "-"
    r = _steady_ratio(steps, row.get("ideal_step_times_ns") or [])
    n = len(steps)
    return "-" if r is None else f"{r:.2f}x (steps {n // 2}-{n - 1})"


def steady_bytes_versus_ideal(row: dict) -> str:
    """The bytes spillway moved (both directions) over the last half of the
    steps, over the bytes the ideal's plans of those steps move: the bytes'
    like for like with *steady* above, where `min_bytes_moved` also counts
    the first steps, which spillway runs before it has learned a step. Sums,
    not medians: a step's copies can run on into the next (the replayer
    counts a copy in the step that queued it)."""
    out, back = row.get("step_bytes_device_to_host") or [], row.get("step_bytes_host_to_device") or []
    ideal = row.get("ideal_step_bytes_moved") or []
    n = len(out)
    if row.get("oom") or n < 4 or n != row.get("steps_in_record") or len(back) != n or len(ideal) != n:
        return "-"
    moved, least = sum(out[n // 2:]) + sum(back[n // 2:]), sum(ideal[n // 2:])
    if not least:
        return "1.00x" if moved == 0 else "-"
    return f"{moved / least:.2f}x (steps {n // 2}-{n - 1})"


def steady_ideal_over_bound(row: dict) -> str:
    """The ideal's median step over the median cyclic bound
    (`sim_cyclic_bound_step_times_ns`), both over the last half of the
    steps: how far the cyclic ideal may be from an optimum of the repeated
    step. Unlike the last step's bound, the cyclic one holds for a plan
    that moves bytes for a step in the step before."""
    r = _steady_ratio(row.get("ideal_step_times_ns") or [],
                      row.get("sim_cyclic_bound_step_times_ns") or [])
    return "-" if r is None else f"{r:.2f}x"


def steady_over_lp_bound(row: dict) -> str:
    """The ideal's mean step over the LP bound's (`lp_bound`,
    harness/lp_bound.py: the window of the last half of the steps, a bound on
    the time of any plan of the ideal's class over that window, and never
    below the baseline): how far the ideal may be from an optimum. Means,
    since the bound is one of the window's sum; '-' where report.py
    --lp-bound did not compute it."""
    lp = row.get("lp_bound")
    ideal = row.get("ideal_step_times_ns") or []
    if not lp or len(ideal) != row.get("steps_in_record"):
        return "-"
    first, last = lp["steps"]
    bound = max(lp["per_step_ns"], row.get("sim_baseline_step_time_ns") or 0)
    return f"{sum(ideal[first:last + 1]) / (last - first + 1) / bound:.2f}x"


def add_lp_bounds(rows: list[dict]) -> None:
    """Each spillway row of a record of 4 steps or more under pressure gets
    `lp_bound` (harness/lp_bound.py) of the last half of its steps."""
    import lp_bound
    records = {}
    for r in rows:
        n = r.get("steps_in_record") or 0
        if r["strategy"] != "spillway" or n < 4 or r.get("oom") or r.get("budget_pct", 100) >= 100:
            continue
        path = r["record"]
        if path not in records:
            records[path] = lp_bound.load(path)
        t0 = time.monotonic()
        try:
            r["lp_bound"] = lp_bound.bound(records[path], r["budget_bytes"], n // 2, n - 1)
        except (ValueError, RuntimeError) as e:  # the budget cannot be met, or HiGHS failed
            log(f"LP bound: {r['trace_name']} {r['budget_label']}: none ({e})")
            continue
        log(f"LP bound: {r['trace_name']} {r['budget_label']}: a step >= "
            f"{r['lp_bound']['per_step_ns'] / 1e6:.3f} ms simulated "
            f"({time.monotonic() - t0:.0f} s wall)")


def last_step_ns(row: dict) -> int | None:
    """The last step's simulated time, if every step ran: after the policy
    has learned from the steps before it (of a two-step record, the first
    step spillway sees again; `steady_versus_ideal` for the steady state)."""
    steps = row.get("step_times_ns") or []
    if row.get("oom") or len(steps) != row.get("steps_in_record"):
        return None
    return steps[-1]


def table(rows: list[dict]) -> str:
    """The markdown table; times are simulated milliseconds."""
    out = [TABLE_HEAD]
    for r in rows:
        ov = overhead_pct(r)
        oom = "yes (step %d)" % r["steps_completed"] if r.get("oom") else "no"
        step = fmt_ms(r.get("sim_step_time_ns")) if not r.get("oom") else \
            f"({fmt_ms(r.get('sim_step_time_ns'))})"
        out.append(
            f"| {r['trace_name']} | {r['budget_label']} | {r['strategy']} "
            f"| {r['steps_completed']}/{r['steps_in_record']} | {oom} | {integrity(r)} "
            f"| {fmt_mib(r['peak_device_bytes'])} / {fmt_mib(r['budget_bytes'])} "
            f"| {fmt_mib(r['bytes_device_to_host'])} / {fmt_mib(r['bytes_host_to_device'])} "
            f"| {step} | {fmt_ms(last_step_ns(r))} | {'-' if ov is None else f'{ov:+.0f}%'} "
            f"| {fmt_ms(r.get('sim_lower_bound_step_time_ns'))} | {r.get('stall_ns', 0) / 1e6:.2f} "
            f"| {fmt_ms(r.get('ideal_step_time_ns'))} | {versus_ideal(r)} "
            f"| {ideal_over_bound(r)} | {heaviest_step(r)} | {steady_versus_ideal(r)} "
            f"| {steady_bytes_versus_ideal(r)} "
            f"| {steady_ideal_over_bound(r)} | {steady_over_lp_bound(r)} | {over_runs(r)} "
            f"| {versus_fresh(r)} |\n")
    return "".join(out)


TABLE_NOTES = """\
All times are **simulated** (the virtual clock of `sim/`, H100 cost model,
55 GB/s each way), never wall-clock. *budget*: percentage of the trace's
unconstrained peak; the simulated device has exactly that many bytes for every
strategy, and `spillway` gets it as its budget. *steps*: completed / in the
trace. *OOM*: an allocation returned NULL (the step it happened in). *peak*:
device memory the simulator handed out. *D2H / H2D*: bytes the strategy moved
each way (the trace's own copies excluded). *step ms*: median step, in
parentheses when the run stopped at an OOM (median of the steps that ran).
*last step*: the trace's last step, when every step ran, once spillway's
policy has learned from the steps before (of a two-step record, the first
step it sees again; with 2 steps, the median is the slower, first one).
*overhead*: median step over the baseline's (strategy none, no memory limit)
median step. *lower bound*: design.md section 9, median over steps, never
below the baseline's same step. *stall*: sum over steps of the time above
the baseline's same step. *ideal*: the step planner (`policy/planner.h`)
given the trace's exact future: the baseline's last step plus the stall its
plan is predicted to cost; *spillway / ideal*: the last step over the
ideal's, and all bytes moved over the ideal plan's (`min_bytes_moved`).
*ideal / last step's bound*: the ideal's last step over that step's own
lower bound (the formula above, for that step alone): how far the ideal may
be from an optimum (under 1.00x can happen: the ideal is cyclic and may
move bytes for this step in the step before, which the formula charges here).
*heaviest step*: spillway's step over the ideal's at the step where the
ideal is slowest (its index): gpt_varlen's long batch, where the last step is
a short one. *steady*: spillway's median step over the ideal's median step,
both over the last half of the steps (records of 4 steps or more): the
steady state of a job whose steps repeat, like for like with the cyclic
ideal (a two-step record's last step is the first spillway has seen).
*steady bytes*: the bytes spillway moved over the same steps (both
directions, summed; the replayer's `step_bytes_device_to_host` and
`step_bytes_host_to_device`) over those the ideal's plans of those steps
move (`ideal_step_bytes_moved`).
*steady: ideal / cyclic bound*: the ideal's median over the same steps'
median cyclic bound (`sim_cyclic_bound_step_times_ns`: the bytes live and
read again at the step's peak less the budget cross each link once a
repeated step, max(baseline, those bytes / link rate)), never above an
optimum of the repeated step. *steady: ideal / LP bound*: the ideal's mean
step over the same steps against the LP bound (`--lp-bound`:
harness/lp_bound.py, the linear relaxation of every plan of the ideal's
class over those steps, with the copy engines' rates and each block's
windows; never above what such a plan achieves, nor below the baseline),
'-' without it. *over the runs*: with `--runs N`, spillway is replayed N
times a case (its background threads meet the job's at other points of
virtual time from run to run); its row is the run of the median last
step, and this column the median [min-max] of every run's spillway / ideal
(last step's time, bytes over all steps). *without foresight*: the last
step over the ideal of that step planned with nothing carried from the step
before (every block live at its start on the device there), time and that
step's bytes: the cyclic ideal may move, at the step before's end, bytes for
this one, which no plan made at the step's start can; "(does not fit)" when
that plan cannot keep the budget.
"""


# ---------------------------------------------------------------- plots

COLORS = {"spillway": "tab:blue", "none": "tab:gray", "save_on_cpu": "tab:red",
          "torchtune": "tab:orange", "layerwise": "tab:green"}


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_memory(runs: list[dict], title: str, out: Path) -> Path:
    """Resident device memory over simulated time, one panel per run (strategy)."""
    plt = _plt()
    n = len(runs)
    fig, axes = plt.subplots(n, 1, figsize=(8, 1.3 * n + 0.9), sharex=True, squeeze=False)
    tmax = max((r["timeline"]["t_ms"][-1] for r in runs if r["timeline"]["t_ms"]), default=1)
    ymax = max([max(r["timeline"]["device"], default=0) for r in runs] +
               [max(r["timeline"]["host"], default=0) for r in runs] +
               [max(live_curve(Path(r["record"])), default=0) for r in runs] +
               [r["budget_bytes"] for r in runs]) / MIB * 1.12
    for ax, r in zip(axes[:, 0], runs):
        tl = r["timeline"]
        for i, (a, b) in enumerate(tl["steps"]):
            if i % 2:
                ax.axvspan(a, b, color="0.93", lw=0)
        color = COLORS.get(r["strategy"], "tab:purple")
        ax.plot(tl["t_ms"], [d / MIB for d in tl["device"]], drawstyle="steps-post",
                lw=1.1, color=color, label="device memory (sim)")
        if any(tl["host"]):
            ax.plot(tl["t_ms"], [h / MIB for h in tl["host"]], drawstyle="steps-post",
                    lw=0.6, color=color, alpha=0.45, ls="--", label="host memory (sim)")
        live = live_curve(Path(r["record"])) if r["strategy"] in ("none", "spillway") else []
        if tl["t_ms"] and len(tl["t_ms"]) <= len(live):
            ax.plot(tl["t_ms"], [b / MIB for b in live[:len(tl["t_ms"])]],
                    drawstyle="steps-post", lw=0.6, color="k", alpha=0.7,
                    label="job's live bytes (requested)")
        ax.axhline(r["budget_bytes"] / MIB, color="tab:red", lw=0.8, ls=":", label="budget")
        status = (f"OOM in step {r['steps_completed']}" if r.get("oom")
                  else f"{r['steps_completed']}/{r['steps_in_record']} steps")
        if r.get("oom") and tl["t_ms"]:
            ax.plot([tl["t_ms"][-1]], [tl["device"][-1] / MIB], "x", color="tab:red", ms=8, mew=2)
        ax.text(0.005, 0.92, f"{r['strategy']}: {status}, peak {r['peak_device_bytes'] / MIB:.0f} MiB",
                transform=ax.transAxes, va="top", fontsize=8)
        ax.set_ylim(0, ymax)
        ax.set_xlim(0, tmax * 1.01)
        ax.set_ylabel("MiB", fontsize=8)
        ax.tick_params(labelsize=7)
    handles = {}
    for ax in axes[:, 0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=4, fontsize=7,
               frameon=False)
    axes[-1, 0].set_xlabel("SIMULATED time (ms, sim virtual clock); shading: alternate steps",
                           fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.035, 1, 0.97))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


def plot_overhead(rows: list[dict], title: str, out: Path) -> Path:
    """Median simulated step time relative to the baseline, against the budget."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    budgets = sorted({r["budget_pct"] for r in rows})
    ooms = []
    for s in dict.fromkeys(r["strategy"] for r in rows):
        pts = sorted((r["budget_pct"], r) for r in rows if r["strategy"] == s)
        xs = [b for b, r in pts if not r.get("oom")]
        ys = [r["sim_step_time_ns"] / r["sim_baseline_step_time_ns"] for b, r in pts
              if not r.get("oom")]
        ax.plot(xs, ys, "o-", color=COLORS.get(s, "tab:purple"), label=s, ms=4, lw=1.2)
        oom = [b for b, r in pts if r.get("oom")]
        if oom:
            ooms.append((s, oom))
    lb = {}
    for r in rows:
        if r.get("sim_lower_bound_step_time_ns") and r.get("sim_baseline_step_time_ns"):
            lb[r["budget_pct"]] = r["sim_lower_bound_step_time_ns"] / r["sim_baseline_step_time_ns"]
    if lb:
        xs = sorted(lb)
        ax.plot(xs, [lb[x] for x in xs], "k--", lw=1, label="lower bound (design.md 9)")
    ax.axhline(1.0, color="0.6", lw=0.8)
    lo, hi = ax.get_ylim()
    for i, (s, xs) in enumerate(ooms):  # out of memory: no step time; marked along the top
        y = hi + (hi - lo) * (0.04 + 0.05 * i)
        ax.plot(xs, [y] * len(xs), "x", color=COLORS.get(s, "tab:purple"), ms=8, mew=2,
                label=f"{s}: out of memory")
    if ooms:
        ax.set_ylim(lo, hi + (hi - lo) * (0.08 + 0.05 * len(ooms)))
    ax.set_xlabel("budget (% of unconstrained peak; device memory = budget)", fontsize=8)
    ax.set_ylabel("median step / baseline step\n(SIMULATED time)", fontsize=8)
    ax.set_xticks(budgets)
    ax.invert_xaxis()
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, frameon=False)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


# ---------------------------------------------------------------- matrix

def run_matrix(binary: Path, traces: list[Path], budgets: list[float], strategies: list[str],
               out: Path, no_data_traces: set[str], steps: int | None = None,
               jobs: int = 1, runs: int = 1) -> list[dict]:
    """Every (trace, budget, strategy) once, spillway's `runs` times: its
    background threads meet the job's at other points of virtual time from
    run to run, so one run's figure may sit anywhere in a wide spread
    (docs/residency.md, session 33). The row kept is the median run
    (`median_run`), with every run's ratios in its `runs`."""
    runs_dir = out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    tasks = []
    for tr in traces:
        name = trace_label(tr)
        nd = name in no_data_traces
        probe = unconstrained_peak(binary, tr, runs_dir, steps=steps)
        peak = probe["unconstrained_peak_bytes"]
        log(f"{name}: unconstrained peak {peak / MIB:.1f} MiB, baseline step "
            f"{probe['sim_baseline_step_time_ns'] / 1e6:.3f} ms (simulated)")
        for pct in budgets:
            dev = int(peak * pct / 100)
            for s in strategies:
                n = runs if s == "spillway" else 1
                for k in range(n):
                    stem = f"{name}_{pct:g}_{s}" + (f"_run{k}" if n > 1 else "")
                    tasks.append(dict(trace=tr, name=name, pct=pct, dev=dev, strategy=s,
                                      no_data=nd, json=runs_dir / f"{stem}.json",
                                      chrome=runs_dir / f"{stem}.trace.json"))

    done = [0]
    done_lock = threading.Lock()

    def one(t):
        rep = replay(binary, t["trace"], run_args(t["strategy"], t["dev"], t["no_data"], steps),
                     t["json"], t["chrome"])
        rep.pop("stdout", None)
        rep.update(trace_name=t["name"], budget_pct=t["pct"], budget_label=budget_label(t["pct"]),
                   device_bytes=t["dev"], chrome_trace=str(t["chrome"]), json_path=str(t["json"]))
        with done_lock:  # runs end in any order with --jobs: the count is of runs finished
            done[0] += 1
            k = done[0]
        log(f"[{k}/{len(tasks)}] {t['name']} {budget_label(t['pct'])} {t['strategy']}: steps "
            f"{rep['steps_completed']}/{rep['steps_in_record']}"
            f"{' OOM' if rep['oom'] else ''}, integrity {integrity(rep)}, median step "
            f"{fmt_ms(rep['sim_step_time_ns'])} ms simulated ({rep['wall_s']} s wall)")
        return rep

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        done_runs = list(ex.map(one, tasks))
    rows, groups = [], {}
    for r in done_runs:  # in the tasks' order: a case's runs are together
        key = (r["trace_name"], r["budget_pct"], r["strategy"])
        if key not in groups:
            groups[key] = []
            rows.append(key)
        groups[key].append(r)
    return [median_run(groups[key]) for key in rows]


def ratios(row: dict) -> tuple[float, float | None] | None:
    """spillway / ideal of one run: the last step's time, and the bytes moved
    over `min_bytes_moved` (None where the ideal moves nothing)."""
    last, ideal = last_step_ns(row), row.get("ideal_step_time_ns")
    if not last or not ideal:
        return None
    moved = row.get("bytes_device_to_host", 0) + row.get("bytes_host_to_device", 0)
    least = row.get("min_bytes_moved")
    return last / ideal, (moved / least if least else None)


def median_run(runs: list[dict]) -> dict:
    """The run whose last step is the median of the runs' (the upper of the
    two middle ones for an even count; by the median step where a run has
    no last step), every run's ratios in its `runs` when there are several:
    the row shows one real run, not a mix of figures from several."""
    if len(runs) == 1:
        return runs[0]
    def key(r):
        last = last_step_ns(r)
        return (last is None, last if last is not None else r.get("sim_step_time_ns") or 0)
    ordered = sorted(runs, key=key)
    row = dict(ordered[len(ordered) // 2])
    row["runs"] = [dict(json=r.get("json_path"), ratios=ratios(r), oom=r.get("oom"),
                        integrity_ok=r.get("integrity_ok"), exit=r.get("exit")) for r in runs]
    row["exit"] = max(r["exit"] for r in runs)  # a failed run fails the report
    return row


def over_runs(row: dict) -> str:
    """Median [range] over the runs of spillway / ideal, time and bytes."""
    rs = [x["ratios"] for x in row.get("runs") or [] if x["ratios"]]
    if len(rs) < 2:
        return "-"
    def spread(xs):
        return f"{_median(xs):.2f}x [{min(xs):.2f}-{max(xs):.2f}]"
    times = [t for t, _ in rs]
    moved = [b for _, b in rs if b is not None]
    return f"{spread(times)}, {spread(moved) if moved else '-'} ({len(rs)} runs)"


ANCHORS = ["save_on_cpu", "torchtune", "layerwise"]


def run_equal_peak(binary: Path, rows: list[dict], out: Path, no_data_traces: set[str],
                   steps: int | None = None, jobs: int = 1) -> list[dict]:
    """Issue 12's target at equal peak memory: for each anchor's run at 100%
    (the device holds the whole trace; the anchor offloads what its tool
    offloads), spillway replays the same trace with its budget set to that
    run's `peak_device_bytes` (the device itself unlimited). One pair per
    anchor row: {"anchor": row, "spillway": report}."""
    runs_dir = out / "runs"
    anchors = [r for r in rows if r["strategy"] in ANCHORS and r["budget_pct"] == 100
               and not r["oom"]]

    def one(a):
        budget = a["peak_device_bytes"]
        args = ["--strategy", "spillway", "--budget", str(budget)]
        if a["trace_name"] in no_data_traces:
            args.append("--no-data")
        if steps is not None:
            args += ["--steps", str(steps)]
        rep = replay(binary, Path(a["record"]), args,
                     runs_dir / f"{a['trace_name']}_peak_of_{a['strategy']}_spillway.json")
        rep.pop("stdout", None)
        log(f"equal peak: {a['trace_name']} at {a['strategy']}'s peak "
            f"({budget / MIB:.0f} MiB): spillway steps {rep['steps_completed']}/"
            f"{rep['steps_in_record']}, integrity {integrity(rep)} ({rep['wall_s']} s wall)")
        return {"anchor": a, "spillway": rep}

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        return list(ex.map(one, anchors))


def slowest_step(row: dict) -> tuple[int, int] | None:
    """(index, simulated ns) of a complete run's slowest step."""
    steps = row.get("step_times_ns") or []
    if row.get("oom") or not steps or len(steps) != row.get("steps_in_record"):
        return None
    i = max(range(len(steps)), key=steps.__getitem__)
    return i, steps[i]


EQUAL_PEAK_HEAD = (
    "| trace | anchor | anchor's peak MiB | spillway's peak MiB | integrity "
    "| anchor's last step ms | spillway's last step ms "
    "| anchor's slowest step ms | spillway's same step ms | all steps: anchor / spillway ms "
    "| spillway faster in every step |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")


def equal_peak_table(pairs: list[dict]) -> str:
    """Each anchor against spillway at the anchor's peak, step by step
    (simulated ms): the last step, the anchor's slowest (gpt_varlen's long
    batch), the sum over steps, and whether spillway is faster in each."""
    out = [EQUAL_PEAK_HEAD]
    for p in pairs:
        a, s = p["anchor"], p["spillway"]
        a_steps, s_steps = a.get("step_times_ns") or [], s.get("step_times_ns") or []
        complete = (not s.get("oom") and len(s_steps) == s.get("steps_in_record")
                    and len(a_steps) == len(s_steps))
        slow = slowest_step(a)
        same = fmt_ms(s_steps[slow[0]]) if complete and slow else "-"
        faster = ("yes" if all(x < y for x, y in zip(s_steps, a_steps)) else "no") \
            if complete else "no (did not complete)"
        out.append(
            f"| {a['trace_name']} | {a['strategy']} | {fmt_mib(a['peak_device_bytes'])} "
            f"| {fmt_mib(s['peak_device_bytes'])} | {integrity(s)} "
            f"| {fmt_ms(last_step_ns(a))} | {fmt_ms(last_step_ns(s))} "
            f"| {fmt_ms(slow[1]) if slow else '-'} (step {slow[0] if slow else '-'}) | {same} "
            f"| {fmt_ms(sum(a_steps))} / {fmt_ms(sum(s_steps)) if complete else '-'} "
            f"| {faster} |\n")
    return "".join(out)


EQUAL_PEAK_NOTES = """\
Issue 12's target at equal peak memory (SIMULATED time): each anchor ran at
100% (the device holds the whole trace; it offloads what its tool offloads),
and spillway replays the same record with its budget set to that run's
device peak (`--budget` in bytes, the device unlimited). *spillway faster
in every step*: each of spillway's steps is shorter than the anchor's same
step.
"""


def write_report(rows: list[dict], out: Path, command: str, plot_budgets: list[float],
                 equal_peak: list[dict] | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    pngs = []
    for name in dict.fromkeys(r["trace_name"] for r in rows):
        trows = [r for r in rows if r["trace_name"] == name]
        for pct in plot_budgets:
            sel = [r for r in trows if r["budget_pct"] == pct]
            if not sel:
                continue
            for r in sel:
                r["timeline"] = read_timeline(Path(r["chrome_trace"]))
            dev = sel[0]["device_bytes"]
            pngs.append(plot_memory(
                sel, f"{name}: resident device memory, device = budget = {budget_label(pct)} of "
                f"unconstrained peak ({dev / MIB:.0f} MiB) - SIMULATED time",
                out / f"memory_{name}_{pct:g}.png"))
            for r in sel:
                r.pop("timeline", None)
        if len({r["budget_pct"] for r in trows}) > 1:
            pngs.append(plot_overhead(trows, f"{name}: step-time overhead vs budget (SIMULATED)",
                                      out / f"overhead_{name}.png"))
    md = ["# spillway-replay matrix (SIMULATED time)\n\n",
          f"Command: `{command}`\n\n", TABLE_NOTES, "\n", table(rows), "\n"]
    if equal_peak:
        (out / "equal_peak.json").write_text(json.dumps(equal_peak, indent=1))
        md += ["## At equal peak memory\n\n", EQUAL_PEAK_NOTES, "\n",
               equal_peak_table(equal_peak), "\n"]
    md += [f"![{p.stem}]({p.name})\n\n" for p in pngs]
    path = out / "report.md"
    path.write_text("".join(md))
    return path


def parse_list(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", "--traces", dest="traces", default="gpt_varlen,resnet50,vit_b16",
                    help="committed record names (harness/records/NAME.spwt) or .spwt paths "
                    "(--traces: its name before session 19)")
    ap.add_argument("--budgets", default="100,60,40",
                    help="percentages of each trace's unconstrained peak")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--out", default=str(REPO / "build" / "report"))
    ap.add_argument("--quick", action="store_true",
                    help="gpt_varlen only, budgets 100,60, strategies spillway,none "
                         "(unless given explicitly)")
    ap.add_argument("--no-data-records", "--no-data-traces", dest="no_data_traces", default="llama7b",
                    help="records replayed in accounting mode (--no-data)")
    ap.add_argument("--plot-budgets", default=None,
                    help="budgets with a memory plot (default: every budget below 100)")
    ap.add_argument("--steps", type=int, default=None, help="replay only the first N steps")
    ap.add_argument("--replay", default=str(REPO / "build" / "bin" / "spillway-replay"))
    ap.add_argument("--jobs", type=int, default=1, help="replays run at once (each is one core)")
    ap.add_argument("--runs", type=int, default=1,
                    help="replay spillway N times a case: its row is the median run, and a column "
                         "gives every run's spread (the other strategies run once)")
    ap.add_argument("--equal-peak", action="store_true",
                    help="then replay spillway with its budget at each anchor's peak at 100%% "
                         "(needs budget 100 and the anchors among the strategies)")
    ap.add_argument("--lp-bound", action="store_true",
                    help="the LP bound (harness/lp_bound.py, needs scipy) of each spillway run of "
                         "a record of 4 steps or more under 100%%: seconds to minutes each")
    raw = sys.argv[1:] if argv is None else argv
    a = ap.parse_args(raw)
    given = {x.split("=")[0] for x in raw}
    if a.quick:
        if not given & {"--records", "--traces"}:
            a.traces = "gpt_varlen"
        if "--budgets" not in given:
            a.budgets = "100,60"
        if "--strategies" not in given:
            a.strategies = "spillway,none"
    binary = Path(a.replay)
    if not binary.exists():
        log(f"{binary} not found: build it first (make build, or cmake --build build "
            "--target spillway-replay spillway simcuda simcupti)")
        return 2
    strategies = parse_list(a.strategies)
    for s in strategies:
        if s not in STRATEGIES:
            ap.error(f"unknown strategy {s}; known: {', '.join(STRATEGIES)}")
    budgets = [float(b.rstrip("%")) for b in parse_list(a.budgets)]
    traces = [trace_path(t) for t in parse_list(a.traces)]
    for t in traces:
        if not t.exists():
            ap.error(f"trace {t} not found")
    plot_budgets = ([float(b.rstrip("%")) for b in parse_list(a.plot_budgets)]
                    if a.plot_budgets else [b for b in budgets if b < 100] or budgets[:1])
    if a.runs < 1:
        ap.error(f"--runs must be 1 or more, not {a.runs}")
    if a.equal_peak and (100 not in budgets or not set(ANCHORS) & set(strategies)):
        ap.error("--equal-peak needs budget 100 and at least one of " + ", ".join(ANCHORS))
    out = Path(a.out)
    t0 = time.monotonic()
    try:
        rows = run_matrix(binary, traces, budgets, strategies, out,
                          set(parse_list(a.no_data_traces)), a.steps, a.jobs, a.runs)
        pairs = (run_equal_peak(binary, rows, out, set(parse_list(a.no_data_traces)), a.steps,
                                a.jobs) if a.equal_peak else None)
        if a.lp_bound:
            add_lp_bounds(rows)
    except ReplayError as e:
        log(str(e))
        return 1
    command = "/usr/bin/python3 harness/report.py " + shlex.join(raw)
    path = write_report(rows, out, command.strip(), plot_budgets, pairs)
    print(table(rows), end="")
    if pairs:
        print("\n" + equal_peak_table(pairs), end="")
    log(f"wrote {path} and its plots in {out} ({time.monotonic() - t0:.0f} s wall clock; "
        "every figure in them is simulated time)")
    runs = rows + [p["spillway"] for p in pairs or []]
    return 0 if all(r["exit"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
