"""spillway-run: environment, LD_PRELOAD, exec; the command with or without `--`; every
option checked at once, as the shim checks it; --version and --help; one shim per rank
under torchrun. The installed copies are tested in tests/install."""
import glob
import json
import os
import re
import shutil
import subprocess

import pytest

from conftest import PYTHON, ROOT

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
                 ["--budget", "1GiB", "--"]):
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


# --- The command with or without `--` (issue 13 item 5) ---------------------------

ARGV = """import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "budget": os.environ.get("SPILLWAY_GPU_BUDGET"),
                  "mode": os.environ.get("SPILLWAY_MODE"), "foo": os.environ.get("FOO")}))
"""


def launched(spw, *argv):
    r = spw.run([spw.launcher] + list(argv), spw.environ(preload=False))
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_command_needs_no_double_dash(spw):
    out = launched(spw, "--budget", "40GiB", PYTHON, "-c", ARGV, "--lr", "1")
    assert out == {"argv": ["--lr", "1"], "budget": "40GiB", "mode": None, "foo": None}
    # With `--` it is the same command.
    assert launched(spw, "--budget", "40GiB", "--", PYTHON, "-c", ARGV, "--lr", "1") == out


def test_options_after_the_command_are_the_commands(spw):
    # spillway-run's own options, --version and --help among them, once the command has begun.
    out = launched(spw, "--mode", "off", PYTHON, "-c", ARGV, "--budget", "40G", "--version",
                   "--help", "--", "x")
    assert out == {"argv": ["--budget", "40G", "--version", "--help", "--", "x"],
                   "budget": None, "mode": "off", "foo": None}
    # A command that takes a command: env (nsys, numactl alike).
    out = launched(spw, "--budget=85%", "env", "FOO=1", PYTHON, "-c", ARGV, "--mode", "host")
    assert out == {"argv": ["--mode", "host"], "budget": "85%", "mode": None, "foo": "1"}


def test_python_without_double_dash_gets_spillway(spw):
    r = spw.run([spw.launcher, "--budget", "64MiB", PYTHON, "-c",
                 "import torch, spillway; print(spillway.library_path())"],
                spw.environ(preload=False))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == os.path.realpath(spw.lib)


def test_a_command_that_cannot_run_exits_as_from_a_shell(spw):
    r = spw.run([spw.launcher, "no-such-command-spw"], spw.environ(preload=False))
    assert r.returncode == 127 and "no-such-command-spw" in r.stderr, r.stderr
    r = spw.run([spw.launcher, "--", spw.tmp], spw.environ(preload=False))  # a directory
    assert r.returncode == 126, r.stderr


def test_the_command_gets_the_signal_dispositions_of_a_shell(spw):
    # Python ignores SIGPIPE and SIGXFSZ; the launcher must not pass that on through exec.
    argv = ["/bin/grep", "^SigIgn", "/proc/self/status"]
    direct = spw.run(argv, spw.environ(preload=False))
    launched_ = spw.run([spw.launcher] + argv, spw.environ(preload=False))
    assert launched_.returncode == 0, launched_.stderr
    assert launched_.stdout == direct.stdout


def test_a_preloaded_library_is_not_added_twice(spw):
    lib = os.path.realpath(spw.lib)
    r = spw.run([spw.launcher, "/usr/bin/env"], spw.environ(preload=False, LD_PRELOAD=lib))
    assert r.returncode == 0, r.stderr
    got = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    assert got["LD_PRELOAD"] == lib


# --- Every value checked before anything runs ---------------------------------------

SIZE_FORMS = ("a size such as 40GiB, 512MiB, 1.5GB or 1073741824 (bytes), "
              "or a percentage such as 85% (0.0001% to 100%)")

BAD = [  # option, a bad value, what the message says is accepted
    ("--budget", "40G", SIZE_FORMS),
    ("--budget", "40 GiB", SIZE_FORMS),
    ("--budget", "0", SIZE_FORMS),
    ("--budget", "101%", SIZE_FORMS),
    ("--budget", "", SIZE_FORMS),
    ("--mode", "fast", "host, managed or off"),
    ("--mode", "", "host, managed or off"),
    ("--trace", "", "a file path (Chrome trace JSON)"),
    ("--record", "", "a file path (a .spwt record, docs/record-format.md)"),
    ("--stats", "", "a file path"),
]


def marker_command(spw):
    marker = os.path.join(spw.tmp, "ran")
    return marker, ["/bin/sh", "-c", 'echo ran > "$0"', marker]


@pytest.mark.parametrize("option,value,accepted", BAD)
def test_each_options_bad_value_is_refused_before_anything_runs(spw, option, value, accepted):
    marker, command = marker_command(spw)
    for argv in ([option, value] + command, ["%s=%s" % (option, value), "--"] + command):
        r = spw.run([spw.launcher] + argv, spw.environ(preload=False))
        assert r.returncode == 2, (argv, r.stderr)
        assert r.stdout == ""
        assert r.stderr.startswith("spillway-run: %s '%s' is not valid" % (option, value)), r.stderr
        assert "accepted: %s\n" % accepted in r.stderr, r.stderr
        assert not os.path.exists(marker), argv


def test_every_bad_option_is_named_at_once(spw):
    marker, command = marker_command(spw)
    argv = ["--budget", "40G", "--mode", "fast", "--trace", "", "--record=", "--stats", "",
            "--bugdet", "1GiB"] + command
    r = spw.run([spw.launcher] + argv, spw.environ(preload=False))
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert not os.path.exists(marker)
    lines = r.stderr.splitlines()
    assert lines[0] == "spillway-run: nothing was run:", r.stderr
    for option, value, accepted in [b for b in BAD if b[1] in ("40G", "fast")] + BAD[-3:]:
        assert any(line.startswith("  %s '%s' is not valid" % (option, value))
                   and line.endswith("accepted: " + accepted) for line in lines), (option, r.stderr)
    assert "  --bugdet: unknown option; did you mean --budget?" in r.stderr, r.stderr
    assert "usage: spillway-run" in r.stderr
    # A missing command is named with the rest.
    r = spw.run([spw.launcher, "--budget", "40G"], spw.environ(preload=False))
    assert r.returncode == 2
    assert "--budget '40G' is not valid" in r.stderr and "no COMMAND given" in r.stderr


def load_launcher(path):
    """The launcher's functions, from its source (a script without .py: no import)."""
    ns = {"__name__": "spillway_run", "__file__": path}
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), ns)
    return ns


SHIM_CHECK = """
import ctypes, json, os, sys
lib = ctypes.CDLL(sys.argv[1])
lib.spillway_check_config.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
out = []
for variable, value in json.loads(sys.stdin.read()):
    for k in [k for k in os.environ if k.startswith("SPILLWAY_")]:
        del os.environ[k]
    os.environ[variable] = value
    buf = ctypes.create_string_buffer(1024)
    bad = lib.spillway_check_config(buf, len(buf))
    out.append(buf.value.decode() if bad else "")
print(json.dumps(out))
"""

BUDGETS = [
    # accepted by the shim
    "40GiB", "512MiB", "1.5GB", "1073741824", "1", "1B", "4KiB", "0.5GiB", "1TB", "16TiB",
    "40.0GiB", "0.1KB", "85%", "12.5%", "100%", "100.0%", "0.001%", "0.0001%", "007GiB",
    # refused by the shim
    "40G", "40gib", "40 GiB", " 40GiB", "40GiB ", "+4GiB", "-1GiB", "0", "0B", "0GiB", "0.0",
    "0.0001KiB", "1.5", "1.5B", "0%", "101%", "100.1%", "85 %", "%", "-5%", "nan", "inf",
    "0.00009%", "0.0000000000000000000000001%",
    "1e3", "1e3GiB", "0x10", "0x10GiB", "0x55%", "1.GiB", ".5GiB", "1.%", "40GiBx", "",
    "lots", "\u0661\u0662GiB", "17999999999999999999", "18000000000000000000B",
    "99999999999999999999999GiB", "1" * 400, "1" * 400 + "%",
]


def test_the_launcher_refuses_what_the_shim_refuses_with_its_words(spw):
    """The launcher's checks are a copy of config.cpp's: compare them on many values."""
    launcher = load_launcher(spw.launcher)
    cases = [("--budget", v) for v in BUDGETS]
    cases += [("--mode", v) for v in ("host", "managed", "off", "HOST", "fast", "", "off ")]
    cases += [(o, v) for o in ("--trace", "--record", "--stats") for v in ("", "x-{rank}.json")]
    checks = {o[0]: (o[2], o[3]) for o in launcher["OPTIONS"]}
    assert sorted(checks) == ["--budget", "--mode", "--record", "--stats", "--trace"]
    shim_cases = [(checks[o][0], v) for o, v in cases]
    r = subprocess.run([PYTHON, "-c", SHIM_CHECK, spw.lib], input=json.dumps(shim_cases),
                       env=spw.environ(preload=False, sim=False), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    shim = json.loads(r.stdout)
    refused = 0
    for (option, value), (variable, _), message in zip(cases, shim_cases, shim):
        accepted = checks[option][1](value)
        if message:
            refused += 1
            want = "spillway: %s='%s' is not valid; accepted: " % (variable, value)
            assert message.startswith(want), message
            assert accepted == message[len(want):], (option, value, message)
        else:
            assert accepted == "", (option, value, accepted)
    assert 0 < refused < len(cases)


# --- --version and --help ---------------------------------------------------------

def test_version_and_help_need_no_library(spw, tmp_path):
    with open(os.path.join(ROOT, "python", "spillway", "__init__.py")) as f:
        version = re.search(r'__version__ = "([^"]+)"', f.read()).group(1)
    alone = tmp_path / "alone" / "bin"
    alone.mkdir(parents=True)
    shutil.copy(spw.launcher, alone / "spillway-run")
    for launcher in (spw.launcher, str(alone / "spillway-run")):
        r = spw.run([launcher, "--version"], spw.environ(preload=False))
        assert (r.returncode, r.stdout, r.stderr) == (0, "spillway-run %s\n" % version, "")
        r = spw.run([launcher, "--help"], spw.environ(preload=False))
        assert r.returncode == 0 and r.stdout.startswith("usage: spillway-run"), r.stderr
        for option, variable in (("--budget SIZE", "SPILLWAY_GPU_BUDGET"),
                                 ("--mode MODE", "SPILLWAY_MODE"),
                                 ("--trace FILE", "SPILLWAY_TRACE"),
                                 ("--record FILE", "SPILLWAY_RECORD"),
                                 ("--stats FILE", "SPILLWAY_STATS")):
            assert re.search(r"^  %s +sets %s: \S" % (re.escape(option), variable), r.stdout,
                             re.M), (option, r.stdout)
        assert re.search(r"^  --version +print", r.stdout, re.M), r.stdout
        assert "[--] COMMAND [ARGS...]" in r.stdout
    # Without the library a command is not started.
    r = spw.run([str(alone / "spillway-run"), "true"], spw.environ(preload=False))
    assert r.returncode == 2 and "cannot find libspillway.so" in r.stderr, r.stderr


def test_a_library_path_ld_preload_would_split_is_refused(spw, tmp_path):
    prefix = tmp_path / "with space"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "lib").mkdir()
    shutil.copy(spw.launcher, prefix / "bin" / "spillway-run")
    (prefix / "lib" / "libspillway.so").write_bytes(b"")
    marker, command = marker_command(spw)
    r = spw.run([str(prefix / "bin" / "spillway-run")] + command, spw.environ(preload=False))
    assert r.returncode == 2 and "cannot be preloaded" in r.stderr, r.stderr
    assert not os.path.exists(marker)
