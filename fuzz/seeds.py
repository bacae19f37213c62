#!/usr/bin/python3
"""Writes the committed seed corpus, fuzz/corpus/TARGET/* (docs/reliability.md).

Small on purpose: a few valid inputs of each shape, from which libFuzzer's
mutations start. Inputs that once crashed a target (fuzz/corpus/*/crash-*)
are added by hand beside these and are not written here.
    /usr/bin/python3 fuzz/seeds.py
"""
import io
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "harness"))
import spillway_record as st  # noqa: E402


def spwt(meta, body, block_limit=st.MAX_BLOCK):
    out = io.BytesIO()
    w = st.Writer(out, meta, block_limit=block_limit)
    body(w)
    w.close()
    return out.getvalue()


def empty(w):
    pass


def one_step(w):
    k = w.string("matmul")
    site = w.string("site:linear")
    w.alloc(1, 4096, 0, site)
    w.alloc(2, 1024)
    w.copy(0, 1, 4096, 10, (1, 0))
    w.step(0)
    w.phase(1)
    i = w.launch(0, k, 0, [(1, 0, 4096, 1), (2, 0, 512, 2)])
    w.phase(2)
    w.launch(1, k, 20, [(2, 512, 512, 3), (1, 4000, 96, 0)])
    w.copy(0, 4, 1024, 5, (2, 0))
    w.copy(0, 3, 256, 5, (1, 0), (2, 256))
    w.copy(0, 2, 16, 1, (0, 0), (1, 16))
    w.duration(i, 100)
    w.phase(3)
    w.free(2)
    w.free(1, 1)


def two_steps(w):
    k = w.string("k")
    w.alloc(1, 1 << 20)
    for s in range(2):
        w.step(s)
        w.phase(1)
        w.alloc(2 + 2 * s, 8192)
        w.launch(0, k, 50, [(1, 0, 1 << 20, 1), (2 + 2 * s, 0, 8192, 2)])
        w.launch(0, k, 50, [(2 + 2 * s, 0, 8192, 1)])
        w.phase(2)
        w.launch(0, k, 50, [(2 + 2 * s, 0, 8192, 1), (1, 0, 1 << 20, 3)])
        w.free(2 + 2 * s)
        w.phase(0)


def moves(w):
    # Version 2: a recorded run's evictions and restores.
    k = w.string("k")
    w.alloc(1, 4 << 20)
    w.evict(1, 0)
    w.alloc(2, 4 << 20)
    w.step(0)
    w.evict(2, 1)
    w.restore(1, 3)
    w.launch(0, k, 50, [(1, 0, 4 << 20, 3), (2, 0, 4 << 20, 1)])
    w.restore(2, 2)
    w.evict(1, 0)
    w.free(1)
    w.free(2)


SEEDS = {
    "spwt": {
        "empty.spwt": spwt({}, empty),
        "one_step.spwt": spwt({"source": "recorder", "model": "seed"}, one_step),
        "two_steps_layers.spwt": spwt({"layers": 2, "steps": 2}, two_steps),
        "small_blocks.spwt": spwt({"num_layers": 3}, two_steps, block_limit=24),
        "moves.spwt": spwt({"source": "shim"}, moves),
    },
    "size": {
        "gib": b"40GiB",
        "fraction": b"1.5GB",
        "bytes": b"1073741824",
        "percent": b"85%",
        "percent_fraction": b"12.5%",
        "kib": b"4KiB",
        "zero": b"0",
        "tib": b"0.5TiB",
    },
    "config": {
        "budgets": b"SPILLWAY_GPU_BUDGET=40GiB\0SPILLWAY_HOST_BUDGET=60%\0"
                   b"SPILLWAY_HOST_RESERVE=25%\0SPILLWAY_MIN_BLOCK=2MiB\0",
        "modes": b"SPILLWAY_MODE=managed\0SPILLWAY_POLICY=lru\0SPILLWAY_PREFETCH=0\0"
                 b"SPILLWAY_PLAN=off\0SPILLWAY_CUPTI=off\0SPILLWAY_STACKS=1\0",
        "files": b"RANK=3\0SPILLWAY_LOG_LEVEL=warn\0SPILLWAY_LOG_FILE=/tmp/log-{rank}.txt\0"
                 b"SPILLWAY_STATS=stats-{rank}-{pid}.json\0SPILLWAY_TRACE=t.json\0"
                 b"SPILLWAY_RECORD=job.spwt\0SPILLWAY_CUPTI_PATH=/x/libcupti.so.13\0",
        "misspelt": b"PATH=/usr/bin\0LOCAL_RANK=1\0SPILLWAY_GPU_BUDGT=1GiB\0",
        "bad_value": b"SPILLWAY_GPU_BUDGET=0\0",
    },
    "sim_config": {
        "shape": b"SIMCUDA_DEVICE_COUNT=2\0SIMCUDA_DEVICE_MEMORY=24GiB\0SIMCUDA_HOST_MEMORY=1.5TB\0"
                 b"SIMCUDA_GRANULARITY=2097152\0",
        "rates": b"SIMCUDA_H2D_GBPS=55\0SIMCUDA_D2H_GBPS=26.5\0SIMCUDA_BIDIR_GBPS=45\0"
                 b"SIMCUDA_HBM_GBPS=3000\0SIMCUDA_FAULT_GBPS=20\0SIMCUDA_HOST_CREATE_GBPS=3.2\0",
        "costs": b"SIMCUDA_API_NS=500\0SIMCUDA_LAUNCH_NS=4000\0SIMCUDA_VMM_NS=20us\0"
                 b"SIMCUDA_CALL_NS=cuMemCreate:15500,cuMemMap:3600,cuMemSetAccess:31us,cuMemUnmap:1ms\0",
        "flags": b"SIMCUDA_JITTER=7\0SIMCUDA_JITTER_MAX_US=200\0SIMCUDA_HOST_NUMA_VMM=0\0"
                 b"SIMCUDA_CONCURRENT_MANAGED=1\0SIMCUDA_DATA=0\0SIMCUDA_LOG=1\0"
                 b"SIMCUDA_FAIL=cuMemCreate:3+\0",
        "misspelt": b"PATH=/usr/bin\0SIMCUDA_DEVICE_MEMRY=1GiB\0",
        "bad_value": b"SIMCUDA_GRANULARITY=5000\0",
        "fail_items": b"SIMCUDA_FAIL=cuMemCreate:3,cuMemMap:1+:CUDA_ERROR_OUT_OF_MEMORY,"
                      b"cuMemcpyDtoHAsync_v2:18446744073709551615,cuEventRecord:2:CUDA_ERROR_UNKNOWN\0",
    },
    "replay_args": {
        "plain": b"job.spwt\0--budget\0" b"60%\0--steps\0" b"3\0--json\0out.json",
        "sizes": b"job.spwt\0--budget\0" b"1.5GiB\0--device-memory\0" b"80GiB\0--no-data",
        "layerwise": b"--strategy\0layerwise\0--layers\0" b"12\0--offload-layers\0" b"4\0"
                     b"--mode\0managed\0job.spwt\0--trace-out\0t.json\0--shim\0/x.so",
        "child": b"job.spwt\0--strategy\0none\0--baseline-child\0--quiet\0"
                 b"--inject-corruption\0" b"7\0--help",
        "report.json": b'{\n  "peak_device_bytes": 1048576,\n  "sim_step_time_ns": 2500,\n'
                       b'  "budget_bytes": 524288,\n  "step_times_ns": [2400,2500,2600],\n'
                       b'  "shim": {"budget_bytes": 524288}\n}\n',
    },
}


def main():
    for target, files in SEEDS.items():
        d = os.path.join(HERE, "corpus", target)
        os.makedirs(d, exist_ok=True)
        for name, data in files.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
    print("wrote", sum(len(f) for f in SEEDS.values()), "seeds under", os.path.join(HERE, "corpus"))


if __name__ == "__main__":
    main()
