#!/usr/bin/env python3
"""Fails, in turn, each driver and CUPTI entry point spillway calls, at its
first call and at a later one, in a replay with every byte checked, and says
what happened (issue 15 item 2; docs/reliability.md, "Driver failures").

    fault_matrix.py --replay build/bin/spillway-replay --shim build/lib/libspillway.so \
        [--record harness/records/gpt_varlen.spwt] [--budget 40%] [--mode host|managed] \
        [--seed 1] [--out table.md]

A clean run first gives each entry point's call count (the replayer's
`driver_calls`). Then, for each entry point called at least once, one run
with SIMCUDA_FAIL=NAME:1 and one with NAME:N, N drawn (seeded) from 2 to the
count. Each run must end in one of:

  goes on       the replay finished every step, every byte intact
  OOM           spillway returned NULL to the job (an OOM PyTorch handles)
                and every byte checked before it was intact
  job's call    a call the job itself made failed (the replayer, like a
                framework, stops with the driver's named error); spillway
                lost nothing it was checked for

and never in a crash, a hang (--timeout), lost bytes or a run that stops
without a named reason. Exit status 0 when none did, 1 otherwise, 2 on a
usage error. All times are the simulator's, and none is reported.
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile


def run(replay, shim, trace, budget, timeout, fault, json_path, extra=(), env_add=None):
    """One replay with `fault` (a SIMCUDA_FAIL spec, "" for none): (process, JSON, why)."""
    env = dict(os.environ)
    env.pop("SIMCUDA_FAIL", None)
    env.pop("SIMCUPTI_FAIL", None)
    env.update(env_add or {})
    if fault:
        env["SIMCUDA_FAIL"] = fault
    cmd = [replay, trace, "--budget", budget, "--shim", shim, "--json", json_path, *extra]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, None, "hang"
    try:
        with open(json_path) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        d = None
        p.stderr += f"\nfault_matrix: its JSON ({json_path}) did not load: {e}"
    os.unlink(json_path) if os.path.exists(json_path) else None
    return p, d, None


def cupti_entry_points():
    """The CUPTI entry points spillway calls (cuda/cupti_entry_points.def)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "cuda",
                        "cupti_entry_points.def")
    with open(path) as f:
        return re.findall(r"^CUPTI_ENTRY_POINT\((\w+)\)", f.read(), re.M)


def spillway_said(stderr):
    """spillway's first warning or error, shortened: what a user would read."""
    for line in stderr.splitlines():
        if line.startswith("[spillway W]") or line.startswith("[spillway E]"):
            line = re.sub(r"0x[0-9a-f]+", "ADDR", line)
            return line[:150]
    return ""


def row(name, which, spec, p, ok, outcome):
    """One row of the table, said as it comes (with the end of stderr when it failed)."""
    print(f"{spec} -> {outcome}", flush=True)
    if not ok and p is not None:
        print(f"  exit status {p.returncode}; the end of its stderr:\n" +
              "\n".join(p.stderr.splitlines()[-15:]), flush=True)
    said = spillway_said(p.stderr) if p else ""
    return (name, which, outcome if ok else "**" + outcome + "**", said)


def classify(p, d, why):
    """(ok, outcome) for one run."""
    if why == "hang":
        return False, "HANG (no end within the timeout)"
    if p.returncode < 0:
        return False, f"CRASH (signal {-p.returncode})"
    if p.returncode not in (0, 1):
        return False, f"CRASH (exit status {p.returncode})"
    if d is None:
        return False, "STOPPED without its JSON"
    if d.get("integrity_ok") is False:
        return False, "LOST BYTES: " + str(d.get("first_mismatch", ""))[:100]
    # An access to an address with nothing mapped: the simulated context's
    # sticky error, after which no kernel runs (so checks no byte). Whoever
    # made the access, the run did not keep the job going nor stop it cleanly.
    fault = re.search(r"^simcuda: .*illegal address.*$", p.stderr, re.M)
    if fault:
        return False, "FAULT: " + fault.group(0)[:100]
    if d.get("oom"):
        return True, "OOM returned to the job"
    if d.get("replay_error"):
        err = d["replay_error"]
        if "CUDA_ERROR_" not in err and "cannot" not in err:
            return False, "STOPPED without a named error: " + err[:100]
        return True, "job's call failed: " + err[:80]
    if d.get("steps_completed") != d.get("steps_in_record"):
        return False, "STOPPED early without a reason"
    return True, "goes on, every byte intact"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replay", required=True)
    ap.add_argument("--shim", required=True)
    ap.add_argument("--record", "--trace", dest="trace", default=os.path.join(os.path.dirname(__file__), "..", "records",
                                                    "gpt_varlen.spwt"))
    ap.add_argument("--budget", default="40%")
    ap.add_argument("--mode", default="host", choices=["host", "managed"],
                    help="SPILLWAY_MODE of the replays (the replayer's --mode)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a run may take")
    ap.add_argument("--only", default="", help="comma-separated entry points (default: all called)")
    ap.add_argument("--every-later", action="store_true",
                    help="also fail the drawn later call of each driver entry point and every "
                    "call after it")
    ap.add_argument("--out", default="", help="also write the table here (markdown)")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="spw-faults-")
    jp = os.path.join(tmp, "run.json")
    mode = ["--mode", args.mode]

    def run_with(fault):
        return run(args.replay, args.shim, args.trace, args.budget, args.timeout, fault, jp, mode)

    p, d, why = run_with("")
    ok, outcome = classify(p, d, why)
    if not ok or d.get("oom") or d.get("integrity_ok") is not True:
        print(f"fault_matrix: the clean run did not pass ({outcome}); stderr:\n"
              f"{p.stderr if p else ''}", file=sys.stderr)
        return 1
    counts = d["driver_calls"]
    only = [s for s in args.only.split(",") if s]
    rng = random.Random(args.seed)
    rows, failed = [], 0
    for name, count in counts.items():
        if only and name not in only:
            continue
        if count == 0:
            rows.append((name, "-", "not called in this run", ""))
            continue
        nths = [1] + ([rng.randint(2, count)] if count >= 2 else [])
        # That call alone, then (with --every-later) it and every later one:
        # a driver that keeps failing, not one that fails once.
        runs = [(n, "") for n in nths]
        if args.every_later:
            runs.append((nths[-1], "+"))
        for n, plus in runs:
            p, d, why = run_with(f"{name}:{n}{plus}")
            ok, outcome = classify(p, d, why)
            failed += not ok
            which = f"{n} of {count}" if not plus else f"{n} and every later one"
            rows.append(row(name, which, f"{name}:{n}{plus}", p, ok, outcome))
    # CUPTI's entry points (the simulated CUPTI's SIMCUPTI_FAIL), in runs
    # that also write a Chrome trace (SPILLWAY_TRACE): no call counts come
    # back from it, so each fails at its first call and at a seeded one of
    # its 2nd to 8th; the simulated CUPTI says on stderr when it injected,
    # which tells a failure that happened from one not reached.
    for name in cupti_entry_points():
        if only and name not in only:
            continue
        later = rng.randint(2, 8)  # drawn whether or not it runs: the seed's rows stay
        for n in (1, later):
            spec = f"{name}:{n}"
            # With a Chrome trace, so that the calls only it makes are
            # failed too, and the trace must still load.
            trace_json = os.path.join(tmp, "trace.json")
            p, d, why = run(args.replay, args.shim, args.trace, args.budget, args.timeout, "",
                            jp, mode,
                            env_add={"SIMCUPTI_FAIL": spec, "SPILLWAY_TRACE": trace_json})
            ok, outcome = classify(p, d, why)
            if ok:
                try:
                    with open(trace_json) as f:
                        json.load(f)
                except (OSError, ValueError) as e:
                    ok, outcome = False, f"TRACE UNREADABLE: {e}"[:100]
            reached = p is not None and f"simcupti: {name} call {n}: injected" in p.stderr
            if ok and not reached:
                outcome = ("not called in this run" if n == 1 else
                           f"not reached (called fewer than {n} times)")
            failed += not ok
            rows.append(row(name, f"{n} (CUPTI)", spec, p, ok, outcome))
            if not reached:
                break  # a later call is not reached either
    table = ["| entry point | failed call | outcome | what spillway logged first |",
             "| --- | --- | --- | --- |"]
    table += [f"| `{a}` | {b} | {c} | {e.replace('|', '/')} |" for a, b, c, e in rows]
    text = "\n".join(table) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(f"fault_matrix: {len(rows)} rows, {failed} failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
