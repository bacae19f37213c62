"""Fixtures of the install tests: python_bootstrap's (the build tree in
SPW_TEST_BUILD_DIR, the stand-in torch, the simulated GPU, `spw`), the version
of project() and what the build tree's cache says about the install layout."""
import importlib.util
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "python_bootstrap_conftest", os.path.join(HERE, os.pardir, "python_bootstrap", "conftest.py"))
_bootstrap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bootstrap)

BUILD, Env, PYTHON, ROOT = _bootstrap.BUILD, _bootstrap.Env, _bootstrap.PYTHON, _bootstrap.ROOT
spw = _bootstrap.spw  # the fixture
CMAKE = os.environ.get("SPW_TEST_CMAKE") or "cmake"

with open(os.path.join(ROOT, "CMakeLists.txt")) as _f:
    VERSION = re.search(r"project\(spillway VERSION (\d+\.\d+\.\d+)", _f.read()).group(1)


def cache(name):
    """A variable of the build tree's CMakeCache.txt."""
    with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.rstrip("\n").split("=", 1)[1]
    raise KeyError("%s is not in %s/CMakeCache.txt" % (name, BUILD))


def site_env(extra_path=None, **extra):
    """The environment of a user's shell: no SPILLWAY_, PYTHON* or LD_PRELOAD inherited."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SPILLWAY_", "SPW_", "PYTHON", "LD_PRELOAD", "LD_LIBRARY_PATH",
                                "PIP_", "VIRTUAL_ENV", "FAKE_TORCH_"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if extra_path:
        env["PATH"] = extra_path + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    env.update({k: str(v) for k, v in extra.items()})
    return env
