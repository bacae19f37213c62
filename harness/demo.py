#!/usr/bin/python3
"""`make demo`: a GPT job whose longest batch does not fit, on a simulated GPU.

    /usr/bin/python3 harness/demo.py [--build build] [--out build/demo]
        [--trace harness/records/gpt_varlen.spwt] [--fraction 0.65]

Replays the committed trace of a GPT decoder trained on batches of varying
sequence length (harness/records/README.md) through the real libspillway.so on
a simulated device with `fraction` of the trace's unconstrained peak, less
than its longest batch needs:

1. strategy none (the plain allocator, no eviction): expected to run out of
   memory at the long batch;
2. strategy spillway (budget = the device): expected to complete every step
   with every byte checked (integrity_ok);
3. the anchors save_on_cpu, torchtune and layerwise on the same device.

Prints a short table, writes into --out the memory plot (memory.png), a
Perfetto trace of the spillway run (spillway.perfetto.json: the shim's
SPILLWAY_TRACE with every kernel, eviction and restore; replay.perfetto.json:
the replayer's steps and memory counter), each run's JSON report and
summary.json. Exit 0 only if the baseline's OOM and spillway's completion
were both shown.

EVERY TIME IT PRINTS IS SIMULATED: the virtual clock of sim/ (H100 cost model).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402  (harness/report.py)

REPO = report.REPO
MIB = report.MIB
ANCHORS = ["save_on_cpu", "torchtune", "layerwise"]


def say(msg: str = "") -> None:
    print(msg, flush=True)


def step_peaks(trace: Path) -> list[int]:
    """Largest sum of live requested bytes within each step of the trace."""
    import spillway_record as st
    peaks, sizes, cur = [], {}, 0
    for r in st.iter_records(str(trace)):
        if isinstance(r, st.Step):
            peaks.append(cur)
        elif isinstance(r, st.Alloc):
            sizes[r.alloc] = r.size
            cur += r.size
            if peaks:
                peaks[-1] = max(peaks[-1], cur)
        elif isinstance(r, st.Free):
            cur -= sizes.pop(r.alloc, 0)
    return peaks


def run(binary: Path, trace: Path, strategy: str, device: int, out: Path, env=None) -> dict:
    t0 = time.monotonic()
    rep = report.replay(binary, trace, report.run_args(strategy, device, False, None),
                        out / f"{strategy}.json", out / f"{strategy}.replay.trace.json", env=env)
    rep.pop("stdout", None)
    rep.update(trace_name=trace.stem, budget_pct=None, device_bytes=device,
               chrome_trace=str(out / f"{strategy}.replay.trace.json"))
    status = (f"OUT OF MEMORY in step {rep['steps_completed']} ({rep.get('oom_at', '')})"
              if rep["oom"] else f"{rep['steps_completed']}/{rep['steps_in_record']} steps")
    say(f"  {strategy:<12} {status}, integrity {report.integrity(rep)}"
        f"  [{time.monotonic() - t0:.0f} s wall]")
    return rep


def table(rows: list[dict], base_ns: int) -> str:
    head = (f"{'strategy':<12} {'steps':>6} {'OOM':>4} {'peak MiB':>9} {'device MiB':>10} "
            f"{'D2H MiB':>8} {'H2D MiB':>8} {'step ms*':>9} {'overhead*':>10} {'integrity':>10}")
    lines = [head, "-" * len(head)]
    for r in rows:
        ov = report.overhead_pct(r)
        step = "-" if r["oom"] else f"{r['sim_step_time_ns'] / 1e6:.2f}"
        lines.append(
            f"{r['strategy']:<12} {str(r['steps_completed']) + '/' + str(r['steps_in_record']):>6} "
            f"{'yes' if r['oom'] else 'no':>4} {r['peak_device_bytes'] / MIB:>9.0f} "
            f"{r['device_bytes'] / MIB:>10.0f} {r['bytes_device_to_host'] / MIB:>8.0f} "
            f"{r['bytes_host_to_device'] / MIB:>8.0f} "
            f"{step:>9} "
            f"{('-' if ov is None else f'{ov:+.0f}%'):>10} {report.integrity(r):>10}")
    lines.append(f"* SIMULATED time (sim virtual clock, H100 cost model): median step; overhead "
                 f"vs the baseline step {base_ns / 1e6:.2f} ms (strategy none, unlimited memory)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--out", default=None, help="default: BUILD/demo")
    ap.add_argument("--record", "--trace", dest="trace", default=str(REPO / "harness" / "records" / "gpt_varlen.spwt"))
    ap.add_argument("--fraction", type=float, default=0.65,
                    help="simulated device memory as a fraction of the unconstrained peak")
    ap.add_argument("--anchors", default=",".join(ANCHORS))
    a = ap.parse_args(argv)
    t_start = time.monotonic()
    build = Path(a.build)
    binary = build / "bin" / "spillway-replay"
    out = Path(a.out) if a.out else build / "demo"
    trace = Path(a.trace).resolve()
    if not binary.exists():
        say(f"demo: {binary} is missing: run `make demo` (it builds it)")
        return 2
    out.mkdir(parents=True, exist_ok=True)

    say("spillway demo: a training job that does not fit, on a SIMULATED GPU "
        "(every time below is simulated)")
    probe = report.unconstrained_peak(binary, trace, out)
    peak = probe["unconstrained_peak_bytes"]
    base_ns = probe["sim_baseline_step_time_ns"]
    peaks = step_peaks(trace)
    longest = max(range(len(peaks)), key=peaks.__getitem__)
    device = int(peak * a.fraction) // MIB * MIB
    try:
        meta = report_meta(trace)
        lens = meta.get("sequence_lengths")
    except Exception:  # noqa: BLE001 - the meta is decoration here
        lens = None
    say(f"trace {trace.name}: {len(peaks)} steps, live bytes per step (MiB): "
        + ", ".join(f"{p / MIB:.0f}" for p in peaks)
        + (f"; sequence lengths {lens}" if lens else ""))
    say(f"unconstrained peak (plain allocator, unlimited memory): {peak / MIB:.0f} MiB; "
        f"simulated device: {device / MIB:.0f} MiB ({a.fraction:.0%}), less than step "
        f"{longest}'s {peaks[longest] / MIB:.0f} MiB of live tensors")
    if device >= peaks[longest]:
        say("demo: the device is not smaller than the longest step needs; lower --fraction")
        return 2

    shim_trace = out / "spillway.perfetto.json"
    say("replaying (each run also replays the baseline in a child process):")
    none = run(binary, trace, "none", device, out)
    sp = run(binary, trace, "spillway", device, out, env={"SPILLWAY_TRACE": str(shim_trace)})
    anchors = [run(binary, trace, s, device, out) for s in report.parse_list(a.anchors)]
    rows = [none, sp, *anchors]

    (out / "replay.perfetto.json").write_bytes(Path(sp["chrome_trace"]).read_bytes())
    for r in rows:
        r["timeline"] = report.read_timeline(Path(r["chrome_trace"]))
    png = report.plot_memory(
        rows, f"{trace.stem} on a {device / MIB:.0f} MiB simulated device "
        f"({a.fraction:.0%} of the {peak / MIB:.0f} MiB unconstrained peak) - SIMULATED time",
        out / "memory.png")
    for r in rows:
        r.pop("timeline", None)

    baseline_oom = bool(none["oom"]) and none["steps_completed"] < none["steps_in_record"]
    spillway_ok = (not sp["oom"] and sp["steps_completed"] == sp["steps_in_record"]
                   and sp["integrity_ok"] is True and sp["exit"] == 0)
    summary = {
        "time_units": "simulated (sim virtual clock); wall_s is wall clock",
        "trace": str(trace), "device_bytes": device, "unconstrained_peak_bytes": peak,
        "longest_step": longest, "step_live_peaks_bytes": peaks,
        "baseline_oom_shown": baseline_oom, "baseline_oom_step": none["steps_completed"],
        "spillway_completed": spillway_ok,
        "runs": {r["strategy"]: {k: r.get(k) for k in (
            "steps_completed", "steps_in_record", "oom", "oom_at", "integrity_ok",
            "peak_device_bytes", "budget_bytes", "bytes_device_to_host", "bytes_host_to_device",
            "sim_step_time_ns", "sim_baseline_step_time_ns", "sim_lower_bound_step_time_ns",
            "stall_ns", "command", "exit", "wall_s")} for r in rows},
        "files": {"plot": str(png), "perfetto_shim": str(shim_trace),
                  "perfetto_replay": str(out / "replay.perfetto.json")},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))

    say()
    say(table(rows, base_ns))
    say()
    say(f"plain allocator (none): {'OUT OF MEMORY in step ' + str(none['steps_completed']) if baseline_oom else 'did NOT run out of memory'}"
        + (f" (the longest batch is step {longest})" if baseline_oom else ""))
    say(f"spillway: {'completed all ' + str(sp['steps_in_record']) + ' steps, integrity ok' if spillway_ok else 'did NOT complete: ' + str(sp.get('oom_at') or sp.get('first_mismatch') or 'see ' + str(out / 'spillway.json'))}"
        + (f", peak {sp['peak_device_bytes'] / MIB:.0f} MiB of {device / MIB:.0f} MiB, moved "
           f"{sp['bytes_device_to_host'] / MIB:.0f} MiB out / {sp['bytes_host_to_device'] / MIB:.0f} MiB back"
           if spillway_ok else ""))
    say()
    say(f"files in {out}/:")
    say(f"  memory.png               resident device memory over simulated time, per strategy")
    say(f"  spillway.perfetto.json   spillway run: kernels, evictions, restores, memory (SPILLWAY_TRACE)")
    say(f"  replay.perfetto.json     spillway run: steps and the device/host memory counter")
    say(f"  summary.json, <strategy>.json   the reports (times simulated)")
    say("open a trace at https://ui.perfetto.dev (Open trace file, or drag the file in); "
        "its clock is the simulator's")
    say(f"demo took {time.monotonic() - t_start:.0f} s wall clock")
    if not (baseline_oom and spillway_ok):
        say("demo: FAILED: expected the plain allocator to run out of memory and spillway to "
            "complete every step")
        return 1
    return 0


def report_meta(trace: Path) -> dict:
    import spillway_record as st
    meta, _ = st.read(str(trace))
    return meta if isinstance(meta, dict) else json.loads(meta)


if __name__ == "__main__":
    sys.exit(main())
