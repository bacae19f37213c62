"""`pip install` of the wheel into a fresh venv (issue 13 item 2, docs/install.md):
offline, from a copy of the checkout, with Debian's setuptools and wheel. The
wheel holds libspillway.so, the bootstrap, the package and the spillway-run
console script, and each finds the others inside the venv, from any directory.

The module's wheel takes the build tree's libspillway.so (SPW_BUILD_DIR): a
few seconds. test_pip_install_builds_the_library_with_cmake builds it from
scratch as a user's `pip install .` does (minutes): ctest runs it only where
SPILLWAY_TEST_WHEEL_BUILD is on (.ci/run's Release build)."""
import glob
import os
import shutil
import subprocess
import zipfile

import pytest

from conftest import BUILD, PYTHON, ROOT, VERSION, site_env

PIP = ["-m", "pip", "--disable-pip-version-check", "--no-cache-dir"]
OFFLINE = ["--no-build-isolation", "--no-index"]


def run(argv, timeout=300, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)


def checkout(dest):
    """A copy of the source tree without its build trees: what a user clones."""
    def ignore(_, names):
        return [n for n in names if n.startswith(("build", ".git", "__pycache__"))
                or n.endswith(".egg-info")]
    shutil.copytree(ROOT, dest, ignore=ignore)
    return dest


def venv(dest):
    r = run([PYTHON, "-m", "venv", "--system-site-packages", str(dest)], env=site_env())
    assert r.returncode == 0, r.stdout + r.stderr
    return dest


def site_packages(venv_dir):
    (found,) = glob.glob(os.path.join(str(venv_dir), "lib", "python3*", "site-packages"))
    return found


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv, wheel): the wheel built from a checkout with the build tree's library, installed."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = checkout(tmp / "src")
    env = venv(tmp / "venv")
    python = str(env / "bin" / "python")
    r = run([python] + PIP + ["wheel"] + OFFLINE + ["--no-deps", "-w", str(tmp / "dist"), str(src)],
            env=site_env(SPW_BUILD_DIR=BUILD), cwd=tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = glob.glob(str(tmp / "dist" / "*.whl"))
    r = run([python] + PIP + ["install", "--no-index", wheel], env=site_env(), cwd=tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    return env, wheel


def test_the_wheel_holds_the_library_bootstrap_package_and_console_script(installed):
    _, wheel = installed
    assert os.path.basename(wheel).startswith("spillway-%s-py3-none-linux_" % VERSION), wheel
    names = zipfile.ZipFile(wheel).namelist()
    ours = sorted(n for n in names if not n.startswith("spillway-%s.dist-info/" % VERSION))
    assert ours == ["spillway/__init__.py", "spillway/_bootstrap.py", "spillway/_launcher.py",
                    "spillway/lib/libspillway.so",
                    "spillway/lib/spillway_bootstrap/sitecustomize.py"]
    entry_points = zipfile.ZipFile(wheel).read("spillway-%s.dist-info/entry_points.txt" % VERSION)
    assert b"spillway-run = spillway._launcher:main" in entry_points


def test_spillway_run_and_the_package_from_another_directory(installed, tmp_path):
    env, _ = installed
    bin_dir = str(env / "bin")
    r = run([os.path.join(bin_dir, "spillway-run"), "--version"], env=site_env(), cwd=tmp_path)
    assert (r.returncode, r.stdout) == (0, "spillway-run %s\n" % VERSION), r.stderr
    r = run(["python", "-c", "import spillway; print(spillway.__version__); print(spillway.__file__)"],
            env=site_env(bin_dir), cwd=tmp_path)  # an activated venv
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n") == [VERSION, os.path.join(site_packages(env), "spillway",
                                                          "__init__.py"), ""]


TRAIN = """import os, torch, spillway
print(spillway.enabled())
print(spillway.library_path())
print(spillway.__file__)
print(os.environ["SPILLWAY_GPU_BUDGET"])
"""


def test_spillway_run_python_train_py_in_the_venv(spw, installed, tmp_path):
    """`spillway-run -- python train.py` in an activated venv: the wheel's library is
    preloaded, its bootstrap installs it into (the stand-in) torch, `import spillway`
    is the wheel's."""
    env, _ = installed
    (tmp_path / "train.py").write_text(TRAIN)
    environ = spw.environ(preload=False)
    environ["PATH"] = str(env / "bin") + os.pathsep + environ["PATH"]
    r = spw.run(["spillway-run", "--budget", "64MiB", "--", "python", "train.py"], environ,
                cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    package = os.path.join(site_packages(env), "spillway")
    lib = os.path.join(package, "lib", "libspillway.so")
    assert r.stdout.split("\n") == ["True", lib, os.path.join(package, "__init__.py"), "64MiB", ""]
    assert [c["args"][0] for c in spw.calls() if c["call"] == "CUDAPluggableAllocator"] == [lib]


def test_a_preload_of_the_wheels_library_into_another_python(spw, installed, tmp_path):
    """The system's python3, outside the venv, with the wheel's library preloaded gets
    the wheel's package through the bootstrap beside the library."""
    env, _ = installed
    package = os.path.join(site_packages(env), "spillway")
    lib = os.path.join(package, "lib", "libspillway.so")
    (tmp_path / "train.py").write_text(TRAIN)
    environ = spw.environ(preload=False, LD_PRELOAD=lib, SPILLWAY_GPU_BUDGET="32MiB")
    r = spw.run([PYTHON, "train.py"], environ, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split("\n") == ["True", lib, os.path.join(package, "__init__.py"), "32MiB", ""]
    # An allocation through the wheel's library on the simulated GPU.
    r = spw.python("import torch, spillway\nlib = spillway._load()\n"
                   "p = lib.spillway_malloc(4 << 20, 0, None)\nassert p\n"
                   "lib.spillway_free(p, 4 << 20, 0, None)\nprint(spillway.stats()['mallocs'])",
                   environ, cwd=str(tmp_path))
    assert (r.returncode, r.stdout) == (0, "1\n"), r.stdout + r.stderr


def test_pip_install_builds_the_library_with_cmake(tmp_path):
    """A user's `pip install --no-build-isolation .`: nothing preset, CMake builds the library."""
    src = checkout(tmp_path / "src")
    env = venv(tmp_path / "venv")
    r = run([str(env / "bin" / "python")] + PIP + ["install"] + OFFLINE + ["."],
            env=site_env(), cwd=src, timeout=1800)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-5000:]
    assert glob.glob(os.path.join(src, "build-wheel", "temp*", "cmake", "CMakeCache.txt"))
    r = run([str(env / "bin" / "spillway-run"), "--", str(env / "bin" / "python"), "-c",
             "import spillway; print(spillway.enabled(), spillway.library_path())"],
            env=site_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lib = os.path.join(site_packages(env), "spillway", "lib", "libspillway.so")
    assert r.stdout == "True %s\n" % lib
