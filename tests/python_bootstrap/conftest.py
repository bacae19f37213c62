"""Fixtures of the bootstrap, launcher and Python API tests.

They run child processes of /usr/bin/python3 with libspillway.so preloaded, a
stand-in `torch` (fake_torch/) first on PYTHONPATH, and the simulated GPU
(build/sim) as the driver and CUPTI. ctest passes the build tree in
SPW_TEST_BUILD_DIR (default: ../../build).
"""
import json
import os
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.abspath(os.environ.get("SPW_TEST_BUILD_DIR") or os.path.join(ROOT, "build"))
PYTHON = "/usr/bin/python3"


class Env:
    build = BUILD
    lib = os.path.join(BUILD, "lib", "libspillway.so")
    bootstrap = os.path.join(BUILD, "lib", "spillway_bootstrap")
    sim = os.path.join(BUILD, "sim")
    launcher = os.path.join(BUILD, "bin", "spillway-run")
    fake_torch = os.path.join(HERE, "fake_torch")
    fake_bin = os.path.join(HERE, "fake_bin")
    python_src = os.path.join(ROOT, "python")

    def __init__(self, tmp):
        self.tmp = str(tmp)
        self.log = os.path.join(self.tmp, "torch-calls.jsonl")

    def environ(self, preload=True, sim=True, pythonpath=None, **extra):
        """A clean environment: nothing SPILLWAY_ inherited, the fake torch on the path."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SPILLWAY_", "FAKE_TORCH_", "PYTHON", "LD_PRELOAD",
                                    "RANK", "LOCAL_RANK", "WORLD_SIZE"))}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["FAKE_TORCH_LOG"] = self.log
        env["PYTHONPATH"] = self.fake_torch if pythonpath is None else pythonpath
        if preload:
            env["LD_PRELOAD"] = self.lib
        if sim:
            env["LD_LIBRARY_PATH"] = self.sim
            # A real libcupti.so.13 is on this machine's library path: never let it be found.
            env["SPILLWAY_CUPTI_PATH"] = os.path.join(self.sim, "libcupti.so.13")
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def run(self, argv, env, cwd=None, timeout=60):
        return subprocess.run(argv, env=env, cwd=cwd or self.tmp, capture_output=True,
                              text=True, timeout=timeout)

    def python(self, code, env, **kw):
        return self.run([PYTHON, "-c", code], env, **kw)

    def calls(self):
        if not os.path.exists(self.log):
            return []
        with open(self.log) as f:
            return [json.loads(line) for line in f]


@pytest.fixture
def spw(tmp_path):
    for path in (Env.lib, os.path.join(Env.bootstrap, "sitecustomize.py"),
                 os.path.join(Env.sim, "libcuda.so.1")):
        if not os.path.exists(path):
            pytest.fail("%s is missing: build the spillway, simcuda and simcupti targets "
                        "(SPW_TEST_BUILD_DIR=%s)" % (path, BUILD))
    return Env(tmp_path)
