"""`import spillway`: the Python API over the C ABI, driven through ctypes on the sim."""
import json

from conftest import PYTHON

MiB = 1 << 20

PRELUDE = """
import ctypes, json, spillway
lib = spillway._load()
def raw():
    n = lib.spillway_stats_json(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    lib.spillway_stats_json(buf, n + 1)
    return json.loads(buf.value)
def malloc(size):
    p = lib.spillway_malloc(size, 0, None)
    assert p, "spillway_malloc returned NULL"
    return p
MiB = 1 << 20
"""


def run_json(spw, code, **env):
    r = spw.python(PRELUDE + code, spw.environ(SPILLWAY_LOG_LEVEL="error", SPILLWAY_CUPTI="off", **env))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_absent_library_disables_everything(spw):
    code = ("import spillway\n"
            "with spillway.pinned((4096, 4096)):\n"
            "    spillway.mark_step()\n"
            "print(spillway.enabled(), spillway.library_path(), spillway.stats(), "
            "dict(spillway.memory_stats()), spillway.memory_allocated())\n")
    r = spw.python(code, spw.environ(preload=False, pythonpath=spw.python_src))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False None {} {} 0"


def test_stats_are_the_shims_counters(spw):
    out = run_json(spw, """
ps = [malloc(s) for s in (3 * MiB, 5 * MiB, 1000, 64)]
lib.spillway_free(ps[0], 3 * MiB, 0, None)
spillway.mark_step(); spillway.mark_step()
print(json.dumps({"api": spillway.stats(), "raw": raw(), "enabled": spillway.enabled()}))
""")
    assert out["enabled"] is True
    assert out["api"] == out["raw"]
    s = out["api"]
    assert (s["mallocs"], s["frees"], s["steps"]) == (4, 1, 2)
    assert s["live_bytes"] == 5 * MiB + 1000 + 64


def test_memory_stats_map_the_shims_counters_to_torchs_names(spw):
    out = run_json(spw, """
ps = [malloc(s) for s in (4 * MiB, 4 * MiB, 4 * MiB, 512)]
lib.spillway_free(ps[1], 4 * MiB, 0, None)
m = spillway.memory_stats()
print(json.dumps({"m": m, "keys": list(m), "raw": raw(),
                  "calls": [spillway.memory_allocated(), spillway.max_memory_allocated(),
                            spillway.memory_reserved(), spillway.max_memory_reserved()]}))
""", SPILLWAY_GPU_BUDGET="10MiB")
    m, s = out["m"], out["raw"]
    assert out["keys"] == sorted(out["keys"])
    assert s["blocks_evicted"] >= 1  # the budget made it evict: the counters differ
    expected = {
        "allocated_bytes.all.current": s["live_bytes"],
        "allocated_bytes.all.peak": s["recent_peak_live_bytes"],
        "requested_bytes.all.current": s["live_bytes"],
        "requested_bytes.all.peak": s["recent_peak_live_bytes"],
        "active_bytes.all.current": s["live_bytes"],
        "active_bytes.all.peak": s["recent_peak_live_bytes"],
        "reserved_bytes.all.current": s["resident_bytes"],
        "reserved_bytes.all.peak": s["recent_peak_resident_bytes"],
        "reserved_bytes.small_pool.current": s["small_pool_bytes"],
        "allocation.all.allocated": s["mallocs"],
        "allocation.all.freed": s["frees"],
        "allocation.all.current": s["mallocs"] - s["frees"],
        "num_alloc_retries": s["cached_releases"],
        "num_ooms": s["ooms"],
        "num_device_alloc": s["device_creates"],
        "spillway.budget_bytes": s["budget_bytes"],
        "spillway.host_bytes.current": s["host_bytes"],
        "spillway.host_bytes.peak": s["peak_host_bytes"],
        "spillway.evicted_bytes": s["bytes_evicted"],
        "spillway.evicted_blocks": s["blocks_evicted"],
        "spillway.restored_bytes": s["bytes_restored"],
        "spillway.restored_blocks": s["blocks_restored"],
        "spillway.evictions_cancelled": s["evictions_cancelled"],
        "spillway.prefetches_used": s["prefetches_used"],
        "spillway.transfer_wait_ns": s["transfer_wait_ns"],
    }
    assert m == expected
    # No reset yet: the peaks are the process's.
    assert (s["recent_peak_live_bytes"], s["recent_peak_resident_bytes"]) == (
        s["peak_live_bytes"], s["peak_resident_bytes"])
    assert m["allocated_bytes.all.current"] == 8 * MiB + 512
    assert m["allocated_bytes.all.peak"] == 12 * MiB + 512
    assert m["reserved_bytes.all.peak"] <= 10 * MiB
    assert out["calls"] == [m["allocated_bytes.all.current"], m["allocated_bytes.all.peak"],
                            m["reserved_bytes.all.current"], m["reserved_bytes.all.peak"]]


PIN_SCENARIO = """
a = malloc(4 * MiB); b = malloc(4 * MiB)   # the budget is full
with spillway.pinned(*([(a, 4 * MiB)] if PIN else [])):
    c = malloc(4 * MiB)                        # evicts the least recently used: a, unless pinned
    d = malloc(4 * MiB)                        # evicts again
    before = raw()
    with spillway.pinned((a, 4 * MiB)):        # brings a back if it was evicted
        pass
    after = raw()
print(json.dumps({"evicted": before["blocks_evicted"],
                  "restored_by_pin": after["blocks_restored"] - before["blocks_restored"],
                  "peak": after["peak_resident_bytes"]}))
"""


def test_pinned_keeps_a_block_resident_under_a_budget_that_would_evict_it(spw):
    unpinned = run_json(spw, "PIN = False\n" + PIN_SCENARIO, SPILLWAY_GPU_BUDGET="8MiB")
    pinned = run_json(spw, "PIN = True\n" + PIN_SCENARIO, SPILLWAY_GPU_BUDGET="8MiB")
    assert unpinned["evicted"] == 2 and pinned["evicted"] == 2
    assert unpinned["restored_by_pin"] == 1  # a had been evicted
    assert pinned["restored_by_pin"] == 0    # a never left the device
    assert pinned["peak"] <= 8 * MiB


def test_prefetch_brings_an_evicted_block_back_only_into_free_room(spw):
    out = run_json(spw, """
a = malloc(4 * MiB); b = malloc(4 * MiB)   # the budget is full
c = malloc(4 * MiB)                        # evicts a (least recently used)
s0 = raw()
spillway.prefetch((a, 4 * MiB))            # no room: a prefetch never evicts
s1 = raw()
lib.spillway_free(b, 4 * MiB, 0, None)
spillway.prefetch((a, 4 * MiB))            # into b's room
s2 = raw()
print(json.dumps({"evicted": s0["blocks_evicted"],
                  "no_room": s1["blocks_restored"] - s0["blocks_restored"],
                  "room": s2["blocks_restored"] - s1["blocks_restored"],
                  "peak": s2["peak_resident_bytes"]}))
""", SPILLWAY_GPU_BUDGET="8MiB")
    assert out["evicted"] == 1
    assert out["no_room"] == 0
    assert out["room"] == 1
    assert out["peak"] <= 8 * MiB


def test_pinned_accepts_tensors_and_unpins_on_error(spw):
    out = run_json(spw, """
class Storage:
    def __init__(self, p, n): self.p, self.n = p, n
    def data_ptr(self): return self.p
    def nbytes(self): return self.n
class Tensor:  # what spillway.pinned reads of a torch.Tensor
    def __init__(self, p, n): self.s = Storage(p, n)
    def untyped_storage(self): return self.s
a = malloc(4 * MiB); b = malloc(4 * MiB)
try:
    with spillway.pinned(Tensor(a, 4 * MiB), Tensor(b, 4 * MiB)):
        raise KeyError("inside")
except KeyError:
    pass
c = malloc(4 * MiB)  # nothing is pinned any more: room can be made
print(json.dumps(raw()))
""", SPILLWAY_GPU_BUDGET="8MiB")
    assert out["blocks_evicted"] == 1 and out["ooms"] == 0


def test_one_version_everywhere(spw):
    """project()'s VERSION is what the library, the package, the tools and the JSON report."""
    import os
    import re
    import subprocess
    from conftest import ROOT
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        version = re.search(r"project\(spillway VERSION (\d+\.\d+\.\d+)", f.read()).group(1)
    out = run_json(spw, """
lib.spillway_version.restype = ctypes.c_char_p
print(json.dumps({"lib": lib.spillway_version().decode(), "py": spillway.__version__,
                  "stats": spillway.stats()}))
""")
    assert out["lib"] == version
    assert out["py"] == version
    assert (out["stats"]["version"], out["stats"]["schema"]) == (version, 1)
    r = spw.run([spw.launcher, "--version"], spw.environ())
    assert (r.returncode, r.stdout) == (0, "spillway-run %s\n" % version), r.stderr
    replay = os.path.join(spw.build, "bin", "spillway-replay")
    r = subprocess.run([replay, "--version"], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (0, "spillway-replay %s\n" % version), r.stderr
