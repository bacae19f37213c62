#!/usr/bin/env python3
"""A randomized soak of spillway on the simulated GPU (issue 15 item 5;
docs/reliability.md, "The soak").

    soak.py --replay build/bin/spillway-replay --shim build/lib/libspillway.so \
        --jobs 20 [--seed 1] [--records gpt_varlen,resnet50,vit_b16] [--log soak.jsonl]
        [--max-scale 2 --max-devices 2]

Each job is one replay, every byte checked, with its own draw (seeded by
--seed and the job's number, so any job reruns alone with --first N
--jobs 1): a committed trace, its sizes scaled by 1, 2 or 3 (allocations,
touches and copies alike, so every access stays inside its allocation), a
budget of 20-100% of its peak, its work on one stream or spread over two or
three (some frees on another stream than the allocation's), on one device
or on two or three at once (the replayer's --devices: one thread each, the
budget each device's, every device's bytes checked), the
simulator's jitter on or off
(SIMCUDA_JITTER, a seed), and in about a third of the jobs one injected
driver failure (SIMCUDA_FAIL, an entry point spillway calls at a call
number up to 300). Each job must end as fault_matrix.py requires (goes on,
OOM, or the job's own call failed with a named error, never a crash, a hang,
lost bytes) and, unless it ran out of memory, within its budget.

Prints one line per job and a summary; exit status 0 when every job
passed, 1 otherwise (each failure with the command that reproduces it).
All times are the simulator's and none is reported.
"""
import argparse
import json
import os
import random
import shlex
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import fault_matrix  # noqa: E402
import spillway_record as st  # noqa: E402

TRACES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "records")
# Entry points spillway calls on its own behalf with counts in the hundreds
# in a short replay (fault_matrix.py's table).
FAULTS = ["cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemSetAccess", "cuMemUnmap",
          "cuMemcpyDtoDAsync", "cuEventRecord", "cuEventSynchronize", "cuEventQuery",
          "cuStreamWaitEvent"]
# What a job draws from by default: gpt_varlen twice as often.
DEFAULT_RECORDS = ["gpt_varlen", "gpt_varlen", "resnet50", "vit_b16"]


def scaled(trace, k, cache):
    """`trace` with every size, offset and length multiplied by k (cached)."""
    if k == 1:
        return trace
    out = os.path.join(cache, f"{os.path.basename(trace)}.x{k}.spwt")
    if os.path.exists(out):
        return out
    meta, records = st.read(trace)
    meta = dict(meta, soak_scale=k)
    with st.Writer(out, meta) as w:
        for r in records:
            if isinstance(r, st.Alloc):
                r = r._replace(size=r.size * k)
            elif isinstance(r, st.Launch):
                r = r._replace(touches=tuple(t._replace(offset=t.offset * k, length=t.length * k)
                                             for t in r.touches))
            elif isinstance(r, st.Copy):
                r = r._replace(bytes=r.bytes * k, dst=st.Ref(r.dst[0], r.dst[1] * k),
                               src=st.Ref(r.src[0], r.src[1] * k))
            w.write(r)
    return out


def restreamed(trace, n, seed, cache):
    """`trace` with its work spread over `n` streams (cached): each launch
    and copy stays on the stream of the one before it or, one time in four,
    moves to another; an allocation is made on the stream current then, and
    one free in eight is made on another stream than its allocation's. The
    replayer orders a use on another stream than the allocation's last user
    after that user (an event), as PyTorch's record_stream would, so every
    byte still has one right value."""
    if n == 1:
        return trace
    out = os.path.join(cache, f"{os.path.basename(trace)}.s{n}.{seed}.spwt")
    if os.path.exists(out):
        return out
    rng = random.Random(seed)
    meta, records = st.read(trace)
    meta = dict(meta, soak_streams=n)
    current, alloc_stream = 0, {}
    with st.Writer(out, meta) as w:
        for r in records:
            if isinstance(r, (st.Launch, st.Copy)):
                if rng.random() < 0.25:
                    current = rng.randrange(n)
                r = r._replace(stream=current)
            elif isinstance(r, st.Alloc):
                alloc_stream[r.alloc] = current
                r = r._replace(stream=current)
            elif isinstance(r, st.Free):
                own = alloc_stream.pop(r.alloc, current)
                other = [x for x in range(n) if x != own]
                r = r._replace(stream=rng.choice(other) if rng.random() < 0.125 else own)
            w.write(r)
    return out


def draw(seed, job, traces, max_scale=3, max_devices=3):
    """Job `job`'s draw. The caps apply after the draw and take nothing from
    the generator, so every other draw of the job stays as it was (a
    sanitizer build's share: ThreadSanitizer held 15.0 GiB for one
    gpt_varlen x2 job on 3 devices)."""
    rng = random.Random(seed * 1_000_003 + job)
    trace = rng.choice(traces)
    # The larger traces' steps cost seconds each with every byte checked.
    steps = None if trace == "gpt_varlen" else rng.choice([2, 3])
    return {
        "trace": trace,
        "scale": min(rng.choice([1, 1, 2, 3]) if trace == "gpt_varlen" else rng.choice([1, 2]),
                     max_scale),
        "budget": f"{rng.randint(20, 100)}%",
        "jitter": rng.choice([0, rng.randint(1, 1 << 30)]),
        "fault": (f"{rng.choice(FAULTS)}:{rng.randint(1, 300)}" if rng.random() < 1 / 3 else ""),
        "steps": steps,
        # Drawn last, so that adding it left the earlier draws of each job as they were.
        "streams": rng.choice([1, 1, 2, 3]),
        # Drawn after the streams, for the same reason (session 22).
        "devices": min(rng.choice([1, 1, 2, 3]), max_devices),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replay", required=True)
    ap.add_argument("--shim", required=True)
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--first", type=int, default=0, help="number of the first job")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--records", "--traces", dest="traces", default=",".join(DEFAULT_RECORDS),
                    help="committed traces to draw from (repeat one to draw it more often)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a job may take")
    ap.add_argument("--log", default="", help="one JSON line per job here")
    ap.add_argument("--max-scale", type=int, default=3, choices=[1, 2, 3],
                    help="cap each job's drawn scale (its other draws unchanged)")
    ap.add_argument("--max-devices", type=int, default=3, choices=[1, 2, 3],
                    help="cap each job's drawn devices (its other draws unchanged)")
    args = ap.parse_args()
    traces = [t for t in args.traces.split(",") if t]
    cache = tempfile.mkdtemp(prefix="spw-soak-")
    log = open(args.log, "a") if args.log else None
    outcomes, failures = {}, []
    start = time.time()
    for job in range(args.first, args.first + args.jobs):
        d = draw(args.seed, job, traces, args.max_scale, args.max_devices)
        path = scaled(os.path.join(TRACES, d["trace"] + ".spwt"), d["scale"], cache)
        scaled_path = path
        path = restreamed(path, d["streams"], args.seed * 1_000_003 + job, cache)
        extra = ["--steps", str(d["steps"])] if d["steps"] else []
        if d["devices"] > 1:
            extra += ["--devices", str(d["devices"])]
        env = {"SIMCUDA_JITTER": str(d["jitter"])} if d["jitter"] else {}
        p, res, why = fault_matrix.run(args.replay, args.shim, path, d["budget"], args.timeout,
                                       d["fault"], os.path.join(cache, "run.json"), extra, env)
        ok, outcome = fault_matrix.classify(p, res, why)
        if path != scaled_path:
            os.unlink(path)  # one job's own: a long soak would fill the disk
        if ok and res and not res.get("oom") and res.get("within_budget") is False:
            ok, outcome = False, "OVER BUDGET: peak %d > budget %d" % (
                res.get("peak_device_bytes", 0), res.get("budget_bytes", 0))
        key = outcome.split(":")[0]
        outcomes[key] = outcomes.get(key, 0) + 1
        line = f"job {job}: {d['trace']} x{d['scale']} at {d['budget']}" + \
            (f", {d['streams']} streams" if d["streams"] > 1 else "") + \
            (f", {d['devices']} devices" if d["devices"] > 1 else "") + \
            (f", jitter {d['jitter']}" if d["jitter"] else "") + \
            (f", fail {d['fault']}" if d["fault"] else "") + f" -> {outcome}"
        print(line, flush=True)
        if log:
            log.write(json.dumps(dict(d, job=job, ok=ok, outcome=outcome)) + "\n")
            log.flush()
        if not ok:
            failures.append((job, line))
            if p is not None:
                print("  the end of its stderr:\n" + "\n".join(p.stderr.splitlines()[-15:]))
    shutil.rmtree(cache, ignore_errors=True)
    print(f"soak: {args.jobs} jobs in {time.time() - start:.0f} s (wall), "
          + ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items())) + f"; {len(failures)} failed")
    for job, line in failures:
        print(f"  rerun: {shlex.join([sys.executable] + sys.argv[:1])} --replay {args.replay} "
              f"--shim {args.shim} --seed {args.seed} --records {args.traces} --first {job} --jobs 1"
              f" --max-scale {args.max_scale} --max-devices {args.max_devices}"
              f"   # {line}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
