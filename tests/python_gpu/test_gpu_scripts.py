"""harness/gpu/ without a GPU: imports, arguments, the no-GPU exit, struct layouts, PTX."""
import ctypes
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GPU_DIR = os.path.join(REPO, "harness", "gpu")
CHECK = os.path.join(GPU_DIR, "check_assumptions.py")
BENCH = os.path.join(GPU_DIR, "bench_gpt.py")
CUDA_INCLUDE = "/usr/local/cuda/include"
sys.path.insert(0, GPU_DIR)

import bench_gpt  # noqa: E402
import check_assumptions  # noqa: E402
import cuda_ctypes  # noqa: E402


def run(cmd, env=None, timeout=60):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout)


def cc():
    return shutil.which("cc") or shutil.which("gcc")


# --- imports and arguments ------------------------------------------------------
def test_check_assumptions_parses_args():
    a = check_assumptions.parse_args([])
    assert a.check_list == ["a", "b", "c", "d", "e", "f", "g", "h"] and a.device == 0 and a.cuda_lib == "libcuda.so.1"
    assert a.granules == [1, 8, 64, 256] and a.granule_reps == 5 and a.vmm_cycles == 200
    assert a.vmm_mib == [2, 32, 256, 1024]
    assert (a.create_mib, a.piece_mib, a.latency_iters, a.busy_mib) == (2048, 64, 200, 8192)
    a = check_assumptions.parse_args(["--checks", "a,d", "--device", "1", "--no-unsafe", "--bw-mib", "64"])
    assert a.check_list == ["a", "d"] and a.device == 1 and a.no_unsafe and a.bw_mib == 64
    assert check_assumptions.parse_args(["--vmm-mib", "4,64"]).vmm_mib == [4, 64]
    a = check_assumptions.parse_args(["--checks", "f", "--create-mib", "128", "--piece-mib", "16"])
    assert a.check_list == ["f"] and a.create_mib == 128 and a.piece_mib == 16
    with pytest.raises(SystemExit):
        check_assumptions.parse_args(["--checks", "a,z"])
    for bad in (["--create-mib", "0"], ["--piece-mib", "0"], ["--latency-iters", "0"], ["--busy-mib", "-1"]):
        with pytest.raises(SystemExit):
            check_assumptions.parse_args(bad)


def test_unknown_check_lists_every_check():
    r = run([sys.executable, CHECK, "--checks", "a,z"])
    assert r.returncode == 2 and "accepted: a, b, c, d, e, f, g, h" in r.stderr, r.stderr
    r = run([sys.executable, CHECK, "--checks", "g", "--granules", "4,0"])
    assert r.returncode == 2 and "--granules: every size must be at least 1" in r.stderr, r.stderr


def test_latency_summary_and_ratios():
    s = check_assumptions.latency_summary([i * 1e-6 for i in range(1, 11)])  # 1..10 us
    assert s == {"n": 10, "median_us": 5.5, "p90_us": 9.0, "max_us": 10.0}
    assert check_assumptions.latency_summary([]) is None
    one = check_assumptions.latency_summary([3e-6])
    assert one == {"n": 1, "median_us": 3.0, "p90_us": 3.0, "max_us": 3.0}
    busy = {"x": check_assumptions.latency_summary([i * 2e-6 for i in range(1, 11)]), "y": None}
    r = check_assumptions.latency_ratios(busy, {"x": s, "y": s, "z": s})
    assert r == {"x": {"median": 2.0, "p90": 2.0, "max": 2.0}}  # y: nothing timed; z: not run


def test_bench_gpt_parses_args():
    a = bench_gpt.parse_args([])
    assert a.budgets == [100.0, 60.0, 40.0] and a.steps == 20 and a.device == "cuda:0"
    a = bench_gpt.parse_args(["--steps", "5", "--budgets", "80%,30%", "--device", "cuda:1", "--out", "x"])
    assert a.budgets == [80.0, 30.0] and a.steps == 5 and a.out == "x" and a.device == "cuda:1"
    assert a.budget_of == "baseline"
    a = bench_gpt.parse_args(["--budgets", "60%,40.5GiB", "--budget-of", "spillway-off"])
    assert a.budgets == [60.0, "40.5GiB"] and a.budget_of == "spillway-off"
    assert bench_gpt.budget_bytes("40.5GiB", 10) == int(40.5 * 2**30)
    assert bench_gpt.budget_bytes(60.0, 1000) == 600
    assert bench_gpt.budget_label("40.5GiB") == "spillway-40.5GiB"
    for bad in ("60", "0%", "abc%", "", "0GiB", "xGiB"):
        with pytest.raises(SystemExit):
            bench_gpt.parse_args(["--budgets", bad])


def test_bench_gpt_passes_settings_to_spillway_runs_only():
    a = bench_gpt.parse_args(["--set", "SPILLWAY_HOST_RESERVE=100%", "--set", "SPILLWAY_PLAN=off"])
    assert a.settings == [("SPILLWAY_HOST_RESERVE", "100%"), ("SPILLWAY_PLAN", "off")]
    env = bench_gpt.child_env(a, {"SPILLWAY_GPU_BUDGET": "1000"})
    assert env["SPILLWAY_HOST_RESERVE"] == "100%" and env["SPILLWAY_GPU_BUDGET"] == "1000"
    assert not any(k.startswith("SPILLWAY_") for k in bench_gpt.child_env(a, None))
    for bad in ("SPILLWAY_HOST_RESERVE", "HOST_RESERVE=1", "SPILLWAY_GPU_BUDGET=5", "SPILLWAY_MODE=off"):
        with pytest.raises(SystemExit):
            bench_gpt.parse_args(["--set", bad])


@pytest.mark.parametrize("script", [CHECK, BENCH])
def test_help(script):
    r = run([sys.executable, script, "--help"])
    assert r.returncode == 0 and "usage:" in r.stdout


# --- no GPU -----------------------------------------------------------------------
def test_check_assumptions_exits_2_without_libcuda(tmp_path):
    r = run([sys.executable, CHECK, "--cuda-lib", str(tmp_path / "libcuda.so.1")])
    assert r.returncode == 2, r.stderr
    assert "no GPU" in r.stderr and "Traceback" not in r.stderr


def test_check_assumptions_exits_2_with_default_driver_name_absent():
    # This machine has no NVIDIA driver: the default libcuda.so.1 does not load.
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("a libcuda.so.1 is loadable here")
    except OSError:
        pass
    r = run([sys.executable, CHECK], env={"LD_LIBRARY_PATH": ""})
    assert r.returncode == 2 and "no GPU" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("body,expect", [
    ("int cuInit(unsigned f) { return 100; }", "CUresult 100"),  # CUDA_ERROR_NO_DEVICE, no cuGetErrorName
    ("int cuInit(unsigned f) { return 0; }\nint cuDeviceGetCount(int *n) { *n = 0; return 0; }",
     "reports no CUDA device"),
])
def test_check_assumptions_exits_2_when_driver_reports_no_device(tmp_path, body, expect):
    if not cc():
        pytest.skip("no C compiler")
    src = tmp_path / "fake.c"
    src.write_text(body + "\n")
    lib = tmp_path / "libcuda.so.1"
    subprocess.run([cc(), "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    r = run([sys.executable, CHECK, "--cuda-lib", str(lib)])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no GPU" in r.stderr and expect in r.stderr and "Traceback" not in r.stderr


def test_bench_gpt_exits_2_without_gpu():
    r = run([sys.executable, BENCH, "--steps", "2"])
    if r.returncode == 0 or "no GPU" not in r.stderr and "not importable" not in r.stderr:
        pytest.skip("a GPU seems available: " + r.stderr[-200:])
    assert r.returncode == 2 and "Traceback" not in r.stderr


# --- ctypes layouts against the headers ----------------------------------------------
def test_struct_layouts_match_headers(tmp_path):
    if not cc():
        pytest.skip("no C compiler")
    if not os.path.exists(os.path.join(CUDA_INCLUDE, "cuda.h")):
        pytest.skip("no CUDA headers")
    lines, expected = [], []
    for cname, cls in cuda_ctypes.MIRRORED.items():
        lines.append(f'  printf("{cname} sizeof %zu\\n", sizeof({cname}));')
        expected.append(f"{cname} sizeof {ctypes.sizeof(cls)}")
        for fname, _ in cls._fields_:
            lines.append(f'  printf("{cname} {fname} %zu\\n", offsetof({cname}, {fname}));')
            expected.append(f"{cname} {fname} {getattr(cls, fname).offset}")
    src = tmp_path / "layout.c"
    src.write_text(textwrap.dedent("""\
        #include <stddef.h>
        #include <stdio.h>
        #include <cuda.h>
        #include <cuda_runtime_api.h>
        #include <cupti.h>
        int main(void) {
        """) + "\n".join(lines) + "\n  return 0;\n}\n")
    exe = tmp_path / "layout"
    subprocess.run([cc(), "-I", CUDA_INCLUDE, "-o", str(exe), str(src)], check=True)
    got = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()
    assert got == expected
    # the nested allocFlags struct too
    src2 = tmp_path / "flags.c"
    src2.write_text('#include <stdio.h>\n#include <cuda.h>\nint main(void){CUmemAllocationProp p;'
                    'printf("%zu\\n", sizeof(p.allocFlags)); return 0;}\n')
    subprocess.run([cc(), "-I", CUDA_INCLUDE, "-o", str(tmp_path / "flags"), str(src2)], check=True)
    out = subprocess.run([str(tmp_path / "flags")], capture_output=True, text=True, check=True).stdout
    assert int(out) == ctypes.sizeof(cuda_ctypes.CUmemAllocationProp_allocFlags)


def test_constants_match_headers(tmp_path):
    """Every cited enum value, compiled against the headers."""
    if not cc():
        pytest.skip("no C compiler")
    names = [n for n in dir(cuda_ctypes) if n.isupper() and n.startswith(("CU_", "CUDA_", "CUPTI_"))
             and isinstance(getattr(cuda_ctypes, n), int)]
    cbids = [(f"CUPTI_DRIVER_TRACE_CBID_{v}", k) for k, v in cuda_ctypes.DRIVER_LAUNCH_CBIDS.items()]
    cbids += [(f"CUPTI_RUNTIME_TRACE_CBID_{v}", k) for k, v in cuda_ctypes.RUNTIME_LAUNCH_CBIDS.items()]
    body = "".join(f'  printf("%lld\\n", (long long){n});\n' for n in names)
    body += "".join(f'  printf("%lld\\n", (long long){n});\n' for n, _ in cbids)
    src = tmp_path / "consts.c"
    src.write_text("#include <stdio.h>\n#include <cuda.h>\n#include <cupti.h>\nint main(void) {\n"
                   + body + "  return 0;\n}\n")
    subprocess.run([cc(), "-I", CUDA_INCLUDE, "-o", str(tmp_path / "consts"), str(src)], check=True)
    out = subprocess.run([str(tmp_path / "consts")], capture_output=True, text=True, check=True).stdout.split()
    want = [getattr(cuda_ctypes, n) for n in names] + [k for _, k in cbids]
    assert [int(x) for x in out] == want, list(zip(names + [n for n, _ in cbids], out, want))


def test_ptx_assembles():
    ptxas = shutil.which("ptxas") or ("/usr/local/cuda/bin/ptxas" if os.path.exists("/usr/local/cuda/bin/ptxas")
                                      else None)
    if not ptxas:
        pytest.skip("no ptxas")
    import kernels
    r = subprocess.run([ptxas, "-arch=sm_90", "-", "-o", os.devnull], input=kernels.PTX,
                       capture_output=True, text=True)
    if r.returncode != 0 and "-" in r.stderr:  # an older ptxas without stdin input
        pytest.skip(r.stderr)
    assert r.returncode == 0, r.stderr


# --- the simulated driver (a smoke test, not a GPU result) --------------------------------
def test_checks_run_on_the_simulator(tmp_path):
    if os.environ.get("SPW_TEST_SANITIZE"):
        pytest.skip("sanitizer build: its sim cannot be loaded into an uninstrumented python3")
    build = os.environ.get("SPW_TEST_BUILD_DIR", os.path.join(REPO, "build"))
    sim = os.path.join(build, "sim", "libcuda.so.1")
    if not os.path.exists(sim):
        pytest.skip("no simulated driver built")
    out = tmp_path / "r.json"
    # f: the sim's host creation costs no wall time (SIMCUDA_HOST_CREATE_GBPS moves only its virtual
    # clock), so its creating thread needs a high cap to still be creating while the calls are timed.
    r = run([sys.executable, CHECK, "--cuda-lib", sim, "--checks", "a,c,d,e,f,g,h", "--vmm-mib", "2,8", "--bw-mib", "16",
             "--granules", "1,4", "--granule-reps", "2", "--vmm-cycles", "20",
             "--bw-reps", "3", "--memset-chain", "20", "--create-mib", "128", "--piece-mib", "16",
             "--latency-iters", "20", "--busy-mib", "262144", "--json", str(out)],
            env={"LD_LIBRARY_PATH": os.path.dirname(sim)})
    assert r.returncode == 0, r.stdout + r.stderr
    import json
    res = {x["check"]: x for x in json.load(open(out))["results"]}
    assert res["a"]["status"] == "PASS"
    assert res["a"]["measured"]["steps"][-1] == "device memory again: intact"
    assert res["c"]["measured"]["unmap_with_pending_work"] == "CUDA_ERROR_NOT_PERMITTED"  # the sim refuses
    assert res["d"]["measured"]["pinned"]["h2d_GBps"] == pytest.approx(55.0, rel=0.02)  # virtual time
    assert res["e"]["status"] == "PASS"
    assert [row["MiB"] for row in res["e"]["measured"]["host"]] == [2, 8]
    f = res["f"]
    assert f["status"] == "PASS", f["notes"]
    fm = f["measured"]
    assert (fm["piece_MiB"], fm["create_total_MiB"]) == (16, 128)
    assert [row["threads"] for row in fm["host_create_by_threads"]] == [1, 2, 4, 8]
    assert all(row["pieces"] == 8 and row["create_GBps"] > 0 and row["release_GBps"] > 0
               for row in fm["host_create_by_threads"])
    calls = {"event_sync", "device_vmm_cycle", "h2d_1MiB_sync"}  # launch_sync: the sim loads no module
    assert fm["launch_sync"].startswith("not measured: no kernel")
    assert set(fm["latency_alone"]) == calls and all(v["n"] == 20 for v in fm["latency_alone"].values())
    for lat, ratio, other in (("latency_during_host_creation", "during_creation_vs_alone", "creating_thread"),
                              ("latency_during_host_writes", "during_writes_vs_alone", "writing_thread")):
        assert set(fm[lat]) == calls and set(fm[ratio]) == calls and set(fm[other]) == calls
        assert all(v["n"] >= 1 for v in fm[lat].values())  # 20, or more to span 3 pieces
        assert all(set(v) == {"median", "p90", "max"} for v in fm[ratio].values())
    assert all(v["pieces"] >= 1 and v["GBps"] > 0 and v["stopped_by"] == "the calls' end"
               for v in fm["creating_thread"].values())
    assert any(n.startswith("host creation: 1 thread ") for n in f["notes"])
    assert any("during host creation on another thread, an event record + sync took" in n for n in f["notes"])
    g = res["g"]
    assert g["status"] == "PASS", g["notes"]
    gm = g["measured"]
    # the sim takes one grant or unmap over several whole mappings (sim/src/memory.cpp, whole_mappings)
    assert (gm["access_over_4_mappings"], gm["unmap_2_of_4_mappings"], gm["unmap_over_4_mappings"]) == \
        ("CUDA_SUCCESS",) * 3
    assert gm["steps"][-1].endswith("data followed its handle: intact")
    assert [(row["granules"], row["MiB"]) for row in gm["by_size"]] == [(1, 2), (4, 8)]
    assert all(row["granules_total_ms"] >= row["granules_map_ms"] >= 0 for row in gm["by_size"])
    h = res["h"]
    assert h["status"] == "PASS", h["notes"]
    hm = h["measured"]
    assert [(row["threads"], row["cycles"]) for row in hm["cycles_by_threads"]] == [(1, 20), (2, 40), (4, 80)]
    assert hm["cycles_by_threads"][0]["vs_one_thread"] == 1.0
    assert set(hm["beside_vs_alone"]) == calls and all(v["n"] >= 20 for v in hm["latency_beside_vmm_cycles"].values())


def test_bench_gpt_interleaves_variants_and_repeats():
    a = bench_gpt.parse_args(["--budgets", "60%,40%", "--variant", "SPILLWAY_HOST_RESERVE=50%",
                              "--repeat", "2"])
    runs = bench_gpt.budget_runs(a, 1000)
    assert [label for label, _ in runs] == [
        "spillway-60%-r1", "spillway-60%+HOST_RESERVE=50%-r1", "spillway-40%-r1",
        "spillway-40%+HOST_RESERVE=50%-r1", "spillway-60%-r2", "spillway-60%+HOST_RESERVE=50%-r2",
        "spillway-40%-r2", "spillway-40%+HOST_RESERVE=50%-r2"]
    assert runs[0][1] == {"SPILLWAY_GPU_BUDGET": "600"}
    assert runs[3][1] == {"SPILLWAY_GPU_BUDGET": "400", "SPILLWAY_HOST_RESERVE": "50%"}
    one = bench_gpt.budget_runs(bench_gpt.parse_args(["--budgets", "40%"]), 1000)
    assert one == [("spillway-40%", {"SPILLWAY_GPU_BUDGET": "400"})]
    for bad in ("0", "-1", "x"):
        with pytest.raises(SystemExit):
            bench_gpt.parse_args(["--repeat", bad])
    with pytest.raises(SystemExit):
        bench_gpt.parse_args(["--variant", "SPILLWAY_MODE=off"])
