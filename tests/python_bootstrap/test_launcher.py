"""spillway-run: environment, LD_PRELOAD, exec; one shim per rank under torchrun; the
installed layout."""
import glob
import json
import os
import subprocess

from conftest import PYTHON

WORKER = """
import torch  # installs the allocator in the worker, as in a real job
import spillway
lib = spillway._load()
assert lib is not None, "libspillway.so is not loaded in the worker"
p = lib.spillway_malloc(4 << 20, 0, None)
assert p, "spillway_malloc returned NULL"
lib.spillway_free(p, 4 << 20, 0, None)
"""


def test_it_sets_the_environment_and_execs(spw):
    env = spw.environ(preload=False, LD_PRELOAD="/lib/x86_64-linux-gnu/libc.so.6")
    r = spw.run([spw.launcher, "--budget", "40GiB", "--mode=off", "--trace", "t-{rank}.json",
                 "--record", "r-{rank}.spwt", "--stats", "s-{rank}.json", "--",
                 "/usr/bin/env"], env)
    assert r.returncode == 0, r.stderr
    got = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    assert got["SPILLWAY_GPU_BUDGET"] == "40GiB"
    assert got["SPILLWAY_MODE"] == "off"
    assert got["SPILLWAY_TRACE"] == "t-{rank}.json"  # expanded by each process, not here
    assert got["SPILLWAY_RECORD"] == "r-{rank}.spwt"
    assert got["SPILLWAY_STATS"] == "s-{rank}.json"
    assert got["LD_PRELOAD"] == os.path.realpath(spw.lib) + " /lib/x86_64-linux-gnu/libc.so.6"
    assert "PYTHONPATH" in got and got["PYTHONPATH"] == spw.fake_torch  # env is not Python


def test_the_exit_status_and_arguments_are_the_commands(spw):
    r = spw.run([spw.launcher, "--", "/bin/sh", "-c", 'printf "%s|" "$@"; exit 7', "sh", "a b",
                 "--budget"], spw.environ(preload=False))
    assert r.returncode == 7
    assert r.stdout == "a b|--budget|"
    assert r.stderr == ""


def test_usage_errors_exit_2(spw):
    for argv in ([], ["--budget"], ["--budget", "1GiB"], ["--frobnicate", "--", "true"],
                 ["true"]):
        r = spw.run([spw.launcher] + argv, spw.environ(preload=False))
        assert r.returncode == 2, (argv, r.stdout, r.stderr)
        assert r.stderr.startswith("spillway-run: "), r.stderr
    r = spw.run([spw.launcher, "--help"], spw.environ(preload=False))
    assert r.returncode == 0 and "usage: spillway-run" in r.stdout


def test_under_torchrun_each_rank_writes_its_own_stats(spw):
    worker = os.path.join(spw.tmp, "worker.py")
    with open(worker, "w") as f:
        f.write(WORKER)
    env = spw.environ(preload=False, SPILLWAY_LOG_LEVEL="warn")
    r = spw.run([spw.launcher, "--budget", "64MiB", "--stats", "stats-{rank}.json", "--",
                 os.path.join(spw.fake_bin, "torchrun"), "--nproc-per-node", "2", worker], env)
    assert r.returncode == 0, r.stdout + r.stderr
    files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(spw.tmp, "stats-*.json")))
    assert files == ["stats-0.json", "stats-1.json"]  # the agent (no allocation) wrote none
    for name in files:
        with open(os.path.join(spw.tmp, name)) as f:
            s = json.load(f)
        assert s["mallocs"] == 1 and s["frees"] == 1
        assert s["budget_bytes"] == 64 << 20
    # The agent imported torch too: the allocator was installed in all three processes,
    # each with its own shim, and none of them initialized CUDA.
    pids = {c["pid"] for c in spw.calls() if c["call"] == "change_current_allocator"}
    assert len(pids) == 3


def test_the_installed_layout(spw, tmp_path):
    prefix = tmp_path / "prefix"
    r = subprocess.run(["cmake", "--install", spw.build, "--prefix", str(prefix),
                        "--component", "spillway"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    for rel in ("bin/spillway-run", "lib/libspillway.so", "lib/spillway_bootstrap/sitecustomize.py",
                "lib/spillway_bootstrap/spillway/__init__.py", "lib/python/spillway/__init__.py",
                "include/spillway.h"):
        assert (prefix / rel).exists(), rel
    assert os.access(prefix / "bin/spillway-run", os.X_OK)
    # The installed launcher preloads the installed library, whose bootstrap is found next to it.
    r = spw.run([str(prefix / "bin/spillway-run"), "--", PYTHON, "-c",
                 "import torch, spillway; print(spillway.library_path())"],
                spw.environ(preload=False))
    assert r.returncode == 0, r.stderr
    installed = os.path.realpath(prefix / "lib/libspillway.so")
    assert r.stdout.strip() == installed
    assert [c["args"][0] for c in spw.calls() if c["call"] == "CUDAPluggableAllocator"] == [installed]
