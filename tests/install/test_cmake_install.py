"""`cmake --install` into a fresh prefix (issue 13 item 2, docs/install.md): the
GNUInstallDirs layout with the package once and spillway-replay; the installed
launcher, bootstrap and replayer use the installed files; find_package(spillway)
from a consumer project and pkg-config against the prefix."""
import os
import re
import shlex
import subprocess

import pytest

from conftest import BUILD, CMAKE, PYTHON, ROOT, VERSION, cache, site_env

HERE = os.path.dirname(os.path.abspath(__file__))
CONSUMER = os.path.join(HERE, "consumer")


def run(argv, timeout=120, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    return r


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("install") / "prefix"
    r = run([CMAKE, "--install", BUILD, "--prefix", str(prefix), "--component", "spillway"])
    assert r.returncode == 0, r.stdout + r.stderr
    return prefix


def layout():
    dirs = {d: cache("CMAKE_INSTALL_" + d) for d in ("BINDIR", "LIBDIR", "INCLUDEDIR")}
    dirs["PYTHONDIR"] = cache("SPILLWAY_INSTALL_PYTHONDIR")
    return dirs


def test_the_layout_has_every_file_once(prefix):
    d = layout()
    expected = {
        "%(BINDIR)s/spillway-run", "%(BINDIR)s/spillway-replay",
        "%(LIBDIR)s/libspillway.so", "%(LIBDIR)s/spillway_bootstrap/sitecustomize.py",
        "%(LIBDIR)s/spillway/sim/libcuda.so.1", "%(LIBDIR)s/spillway/sim/libcupti.so.13",
        "%(PYTHONDIR)s/spillway/__init__.py", "%(PYTHONDIR)s/spillway/_bootstrap.py",
        "%(INCLUDEDIR)s/spillway.h", "%(LIBDIR)s/pkgconfig/spillway.pc",
        "%(LIBDIR)s/cmake/spillway/spillwayConfig.cmake",
        "%(LIBDIR)s/cmake/spillway/spillwayConfigVersion.cmake",
        "%(LIBDIR)s/cmake/spillway/spillwayTargets.cmake",
    }
    expected = {os.path.normpath(p % d) for p in expected}
    found = {os.path.relpath(os.path.join(top, f), prefix)
             for top, _, files in os.walk(prefix) for f in files}
    # The build type's part of the exported targets (spillwayTargets-relwithdebinfo.cmake).
    per_config = [f for f in found if re.fullmatch(r".*/spillwayTargets-[a-z]+\.cmake", f)]
    assert len(per_config) == 1, sorted(found)
    expected.add(per_config[0])
    assert found == expected  # the package once, nothing of the build tree's
    for tool in ("spillway-run", "spillway-replay"):
        assert os.access(prefix / d["BINDIR"] / tool, os.X_OK), tool
    # Relocatable: no installed text file names the build or source tree.
    for rel in expected:
        with open(prefix / rel, "rb") as f:
            data = f.read()
        if not data.startswith(b"\x7fELF"):
            assert BUILD.encode() not in data and ROOT.encode() not in data, rel


def test_the_installed_launcher_preloads_the_installed_library_and_package(spw, prefix):
    d = layout()
    launcher = str(prefix / d["BINDIR"] / "spillway-run")
    r = spw.run([launcher, "--version"], spw.environ(preload=False))
    assert (r.returncode, r.stdout) == (0, "spillway-run %s\n" % VERSION), r.stderr
    r = spw.run([launcher, "--", PYTHON, "-c",
                 "import torch, spillway; print(spillway.library_path()); print(spillway.__file__);"
                 "print(spillway.enabled())"], spw.environ(preload=False))
    assert r.returncode == 0, r.stderr
    lib = os.path.realpath(prefix / d["LIBDIR"] / "libspillway.so")
    package = os.path.realpath(prefix / d["PYTHONDIR"] / "spillway" / "__init__.py")
    assert r.stdout.split("\n") == [lib, package, "True", ""]
    assert [c["args"][0] for c in spw.calls() if c["call"] == "CUDAPluggableAllocator"] == [lib]


def test_the_installed_replayer_runs_on_the_installed_simulator(prefix, tmp_path):
    d = layout()
    replay = str(prefix / d["BINDIR"] / "spillway-replay")
    r = run(["readelf", "-d", replay])
    rpath = [l for l in r.stdout.splitlines() if "(RPATH)" in l or "(RUNPATH)" in l]
    assert len(rpath) == 1 and "(RPATH)" in rpath[0] and "$ORIGIN/" in rpath[0], rpath
    assert BUILD not in rpath[0]
    r = run([replay, "--version"], env=site_env())
    assert (r.returncode, r.stdout) == (0, "spillway-replay %s\n" % VERSION), r.stderr
    report = tmp_path / "report.json"
    r = run([replay, os.path.join(ROOT, "harness", "records", "gpt_varlen.spwt"), "--steps", "1",
             "--no-data", "--json", str(report)], env=site_env(LD_DEBUG="libs"), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert '"oom": false' in report.read_text()
    # The shim, the simulated driver and CUPTI it loaded are the installed ones.
    loaded = {os.path.basename(p): os.path.realpath(p) for p in
              (l.split("calling init:", 1)[1].strip() for l in r.stderr.splitlines()
               if "calling init:" in l)}
    for name, where in (("libspillway.so", d["LIBDIR"]), ("libcuda.so.1", d["LIBDIR"] + "/spillway/sim"),
                        ("libcupti.so.13", d["LIBDIR"] + "/spillway/sim")):
        assert loaded.get(name) == os.path.realpath(prefix / where / name), (name, loaded.get(name))


def configure_consumer(prefix, tmp_path, requested):
    build = tmp_path / ("consumer-" + requested)
    return build, run([CMAKE, "-S", CONSUMER, "-B", str(build), "-DCMAKE_PREFIX_PATH=%s" % prefix,
                       "-DSPILLWAY_REQUESTED_VERSION=%s" % requested], env=site_env())


def test_find_package_from_a_consumer_project(prefix, tmp_path):
    build, r = configure_consumer(prefix, tmp_path, VERSION.rsplit(".", 1)[0])
    assert r.returncode == 0, r.stdout + r.stderr
    r = run([CMAKE, "--build", str(build)], env=site_env())
    assert r.returncode == 0, r.stdout + r.stderr
    # Linked with the installed library's path in its RUNPATH: no environment needed.
    r = run([str(build / "consumer")], env=site_env())
    assert (r.returncode, r.stdout) == (0, "spillway %s\n" % VERSION), r.stderr
    # spillwayConfigVersion.cmake: another major version is refused, naming the installed one.
    requested = "%d.0" % (int(VERSION.split(".")[0]) + 1)
    _, r = configure_consumer(prefix, tmp_path, requested)
    assert r.returncode != 0
    assert 'compatible with requested version "%s"' % requested in r.stderr, r.stderr
    assert "version: %s" % VERSION in r.stderr, r.stderr


def test_pkg_config(prefix, tmp_path):
    d = layout()
    env = site_env(PKG_CONFIG_PATH=prefix / d["LIBDIR"] / "pkgconfig")
    r = run(["pkg-config", "--modversion", "spillway"], env=env)
    assert (r.returncode, r.stdout) == (0, VERSION + "\n"), r.stderr
    r = run(["pkg-config", "--cflags", "--libs", "spillway"], env=env)
    assert r.returncode == 0, r.stderr
    flags = shlex.split(r.stdout)
    includes = [f[2:] for f in flags if f.startswith("-I")]
    libdirs = [f[2:] for f in flags if f.startswith("-L")]
    assert [os.path.realpath(p) for p in includes] == [os.path.realpath(prefix / d["INCLUDEDIR"])]
    assert [os.path.realpath(p) for p in libdirs] == [os.path.realpath(prefix / d["LIBDIR"])]
    assert "-lspillway" in flags
    exe = tmp_path / "consumer-pc"
    r = run(["cc", "-Wall", "-Wextra", "-Werror", '-DSPILLWAY_EXPECTED_VERSION="%s"' % VERSION,
             os.path.join(CONSUMER, "main.c"), "-o", str(exe)] + flags, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run([str(exe)], env=site_env(LD_LIBRARY_PATH=prefix / d["LIBDIR"]))
    assert (r.returncode, r.stdout) == (0, "spillway %s\n" % VERSION), r.stderr
