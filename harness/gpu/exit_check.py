#!/usr/bin/env python3
"""Two checks on a real GPU that the simulator cannot settle (docs/gpu.md, "exit_check.py"):

  partial-map  cuMemMap of the first granule of a two-granule handle (cuda.h: "offset + size
               must be less than the size of the memory allocation"): is a handle larger than
               its mapping usable, written and read back, unmapped and released?
  sigterm      a PyTorch job with libspillway.so preloaded and SPILLWAY_STATS, SPILLWAY_RECORD
               and SPILLWAY_TRACE set, over its GPU budget, killed by SIGTERM in its fifth
               step: does it die of the signal with all three files whole?

    python3 harness/gpu/exit_check.py --lib build-release/lib/libspillway.so --out exit-out

Prints one PASS/FAIL line per check; exit status 0 when both passed, 1 otherwise, 2 without
a GPU. Wall time is not reported: nothing here is timed.
"""
import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

JOB = r"""
import os, signal, torch
torch.manual_seed(0)
dev = torch.device("cuda")
layers = [torch.nn.Linear(4096, 4096, device=dev) for _ in range(8)]
opt = torch.optim.AdamW([p for l in layers for p in l.parameters()], lr=1e-4)
import spillway
for step in range(8):
    x = torch.randn(512, 4096, device=dev)
    for l in layers:
        x = torch.relu(l(x))
    x.sum().backward()
    opt.step()
    opt.zero_grad()
    torch.cuda.synchronize()
    print("step", step, "evicted", spillway.stats()["bytes_evicted"], flush=True)
    if step == 4:
        os.kill(os.getpid(), signal.SIGTERM)
print("not killed", flush=True)
"""


def check_partial_map(lib):
    import cuda_ctypes as cu
    from check_assumptions import Gpu
    gpu = Gpu(lib, 0)
    prop = gpu.prop(cu.CU_MEM_LOCATION_TYPE_DEVICE, gpu.dev)
    g = gpu.granularity(prop)
    h, r, _ = gpu.create(2 * g, prop)
    if h is None:
        return False, f"cuMemCreate(2 granules) returned {gpu.d.error_name(r)}"
    va = gpu.reserve(g, g)
    try:
        gpu.map_rw(va, g, h)  # the first granule of a two-granule handle
        data = bytes(range(256)) * (g // 256)
        gpu.write(va, data)
        ok = gpu.read(va, g) == data
        gpu.d.check("cuMemUnmap", va, g)
        gpu.d.check("cuMemRelease", h)
        gpu.d.check("cuMemAddressFree", va, g)
    except cu.CudaError as e:
        return False, f"{e}"
    return ok, f"granule {g} bytes: mapped, written, read back {'equal' if ok else 'DIFFERENT'}, " \
               "unmapped, released"


def check_sigterm(lib, out):
    import spillway_record
    os.makedirs(out, exist_ok=True)
    files = {k: os.path.join(out, f) for k, f in
             (("stats", "stats.json"), ("record", "job.spwt"), ("trace", "trace.json"))}
    for f in files.values():
        if os.path.exists(f):
            os.unlink(f)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPILLWAY_")}
    env.update(LD_PRELOAD=os.path.abspath(lib), SPILLWAY_GPU_BUDGET="1GiB",
               SPILLWAY_STATS=files["stats"], SPILLWAY_RECORD=files["record"],
               SPILLWAY_TRACE=files["trace"])
    p = subprocess.run([sys.executable, "-c", JOB], env=env, capture_output=True, text=True,
                       timeout=300)
    with open(os.path.join(out, "job.log"), "w") as f:
        f.write(p.stdout + "\n--- stderr\n" + p.stderr)
    problems = []
    if p.returncode != -signal.SIGTERM:
        problems.append(f"exit status {p.returncode}, not death by SIGTERM")
    if "not killed" in p.stdout:
        problems.append("the job went on after SIGTERM")
    said = {}
    try:
        with open(files["stats"]) as f:
            s = json.load(f)
        said["stats"] = f"mallocs {s['mallocs']}, evicted {s['bytes_evicted']} B"
        if s["bytes_evicted"] == 0:
            problems.append("nothing was evicted: the budget did not bind")
    except (OSError, ValueError, KeyError) as e:
        problems.append(f"stats: {e}")
    try:
        with open(files["trace"]) as f:
            events = json.load(f)
        events = events["traceEvents"] if isinstance(events, dict) else events
        said["trace"] = f"{len(events)} events"
    except (OSError, ValueError) as e:
        problems.append(f"trace: {e}")
    try:
        summary = spillway_record.check(files["record"])
        said["record"] = f"{sum(summary['counts'].values())} records"
    except (OSError, spillway_record.RecordError) as e:
        problems.append(f"record: {e}")
    return not problems, "; ".join(problems) if problems else ", ".join(
        f"{k}: {v}" for k, v in said.items())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", default=os.path.join(os.path.dirname(os.path.dirname(HERE)), "build",
                                                  "lib", "libspillway.so"))
    ap.add_argument("--driver", default="libcuda.so.1")
    ap.add_argument("--out", default="exit-out")
    args = ap.parse_args()
    try:
        ctypes.CDLL(args.driver)
    except OSError as e:
        print(f"exit_check: no GPU: cannot load {args.driver} ({e})", file=sys.stderr)
        return 2
    ok = True
    for name, run in (("partial-map", lambda: check_partial_map(args.driver)),
                      ("sigterm", lambda: check_sigterm(args.lib, args.out))):
        try:
            passed, detail = run()
        except Exception as e:  # a check that cannot run is a failure, said as such
            passed, detail = False, f"{type(e).__name__}: {e}"
        ok = ok and passed
        print(f"[{'PASS' if passed else 'FAIL'}] {name}: {detail}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
