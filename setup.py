"""The wheel: `pip install --no-build-isolation .` (docs/install.md).

It holds, in site-packages:

    spillway/__init__.py, _bootstrap.py          the package (python/spillway)
    spillway/_launcher.py                        tools/spillway-run, LIBDIR = "lib"
    spillway/lib/libspillway.so                  the library
    spillway/lib/spillway_bootstrap/sitecustomize.py   the bootstrap, PACKAGE_DIR = "../.."

and the console script `spillway-run` (spillway._launcher:main). The library's
constructor finds the bootstrap next to itself, and the bootstrap imports the
package beside them, so a job started by the venv's spillway-run gets the
wheel's spillway whichever python3 it runs.

libspillway.so is built by CMake (the `spillway` target, Release, without the
tests) under setuptools' build directory, build-wheel/; CMAKE_ARGS adds
configure arguments (`CMAKE_ARGS=-DCUDAToolkit_ROOT=/opt/cuda`) and
CMAKE_BUILD_PARALLEL_LEVEL sets the jobs. SPW_BUILD_DIR=DIR takes DIR's
libspillway.so as it is instead: DIR must be a CMake build tree of this
version, with the `spillway` target built (the tests use it: a wheel in
seconds).
"""
import os
import re
import shlex
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from wheel.bdist_wheel import bdist_wheel

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD_BASE = os.path.join(ROOT, "build-wheel")  # not setuptools' build/: CMake's build tree


def read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def version():
    m = re.search(r"project\(\s*spillway\s+VERSION\s+([0-9]+\.[0-9]+\.[0-9]+)",
                  read("CMakeLists.txt"))
    if not m:
        raise SystemExit("setup.py: CMakeLists.txt has no project(spillway VERSION X.Y.Z)")
    return m.group(1)


def with_constant(path, name, value):
    """The text of `path` with its one top-level line `NAME = "..."` set to `value`
    (cmake/install.cmake does the same for the installed layout)."""
    line = re.compile(r'^%s = "[^"\n]*"$' % name, re.M)
    text, n = line.subn('%s = "%s"' % (name, value), read(path))
    if n != 1:
        raise SystemExit('setup.py: %s: expected one line `%s = "..."`, found %d' % (path, name, n))
    return text


def run(argv):
    print("setup.py: " + " ".join(shlex.quote(a) for a in argv), flush=True)
    try:
        subprocess.run(argv, check=True)
    except FileNotFoundError:
        raise SystemExit("setup.py: %s is not installed (scripts/install-deps.sh installs what "
                         "the build needs)" % argv[0])
    except subprocess.CalledProcessError as e:
        raise SystemExit("setup.py: %s failed (exit status %d, its output is above)"
                         % (" ".join(argv[:2]), e.returncode))


def library(build_temp):
    """The libspillway.so to put in the wheel: SPW_BUILD_DIR's, or one CMake builds now."""
    given = os.environ.get("SPW_BUILD_DIR")
    if given:
        build = os.path.abspath(given)
        lib = os.path.join(build, "lib", "libspillway.so")
        if not os.path.isfile(lib):
            raise SystemExit("setup.py: SPW_BUILD_DIR=%s has no lib/libspillway.so: build it first "
                             "(cmake --build %s --target spillway), or unset SPW_BUILD_DIR to let "
                             "setup.py build it" % (given, given))
        header = os.path.join(build, "generated", "spillway_version.h")
        built = re.search(r'kVersion\[\] = "([^"]*)"', open(header).read()) \
            if os.path.isfile(header) else None
        if not built or built.group(1) != version():
            raise SystemExit("setup.py: SPW_BUILD_DIR=%s is not a build of spillway %s (%s says %s)"
                             % (given, version(), header, built.group(1) if built else "nothing"))
        return lib
    build = os.path.abspath(os.path.join(build_temp, "cmake"))
    run(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_TESTING=OFF"]
        + shlex.split(os.environ.get("CMAKE_ARGS", "")))
    jobs = [] if os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") else ["-j", str(os.cpu_count() or 1)]
    run(["cmake", "--build", build, "--target", "spillway"] + jobs)
    return os.path.join(build, "lib", "libspillway.so")


class BuildPy(build_py):
    """The package, then the launcher, the library and the bootstrap inside it."""

    def run(self):
        super().run()
        package = os.path.join(self.build_lib, "spillway")
        lib_dir = os.path.join(package, "lib")
        boot_dir = os.path.join(lib_dir, "spillway_bootstrap")
        os.makedirs(boot_dir, exist_ok=True)
        shutil.copyfile(library(self.get_finalized_command("build").build_temp),
                        os.path.join(lib_dir, "libspillway.so"))
        os.chmod(os.path.join(lib_dir, "libspillway.so"), 0o755)
        for source, target, name, value in (
                ("tools/spillway-run", os.path.join(package, "_launcher.py"), "LIBDIR", "lib"),
                ("python/bootstrap/sitecustomize.py", os.path.join(boot_dir, "sitecustomize.py"),
                 "PACKAGE_DIR", "../..")):
            with open(target, "w") as f:
                f.write(with_constant(source, name, value))


class PlatformDistribution(Distribution):
    """Not pure Python (it holds libspillway.so): installed into platlib, a platform wheel."""

    def has_ext_modules(self):
        return True


class BdistWheel(bdist_wheel):
    """Any Python 3 (the package is ctypes, not an extension), one platform."""

    def get_tag(self):
        return ("py3", "none") + tuple(super().get_tag()[2:])


os.makedirs(BUILD_BASE, exist_ok=True)  # egg_info wants it to exist
setup(
    name="spillway",
    version=version(),
    description="Train PyTorch models that do not fit in GPU memory, without changing them",
    long_description=read("README.md"),
    long_description_content_type="text/markdown",
    python_requires=">=3.8",
    packages=["spillway"],
    package_dir={"spillway": "python/spillway"},
    entry_points={"console_scripts": ["spillway-run = spillway._launcher:main"]},
    distclass=PlatformDistribution,
    cmdclass={"build_py": BuildPy, "bdist_wheel": BdistWheel},
    options={"build": {"build_base": BUILD_BASE}, "egg_info": {"egg_base": BUILD_BASE}},
    zip_safe=False,
)
