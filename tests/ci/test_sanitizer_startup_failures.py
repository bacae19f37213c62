""".ci/sanitizer_startup_failures.py reruns only what the sanitizer runtime's
refused memory map broke, on logs shaped like ctest's (CI's own failure of
2026-11-27 is the first)."""
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / ".ci" / "sanitizer_startup_failures.py"

ENOMEM = ("==12121==ERROR: ThreadSanitizer failed to allocate 0x1fdc22b7ff000 "
          "(560485371998208) bytes at address 100001001000 (errno: 12)")


def chunk(n, name, status, body=()):
    return [f"        Start {n}: {name}",
            f"{n - 1}/484 Test #{n}: {name} .......{status}    0.24 sec", *body]


def log(chunks, failed):
    lines = [l for c in chunks for l in c]
    lines += ["", "99% tests passed", "", "The following tests FAILED:"]
    lines += [f"\t{n} - {name} (Failed)" for n, name in failed]
    lines += ["Errors while running CTest"]
    return "\n".join(lines) + "\n"


def run(tmp_path, text):
    p = tmp_path / "ctest.log"
    p.write_text(text)
    return subprocess.run([sys.executable, str(SCRIPT), str(p)], capture_output=True, text=True)


LONG = "ChromeTraceRun.LongRunKeepsEveryBufferWithinItsCap"
OTHER = "Record.EvictionsAndRestoresAreInTheRecord"


def test_the_failure_ci_saw_is_rerun(tmp_path):
    r = run(tmp_path, log([chunk(357, "A.Passes", "   Passed"),
                           chunk(358, LONG, "***Failed", [ENOMEM, "test.cpp:160: Failure"]),
                           chunk(359, "B.Passes", "   Passed")], [(358, LONG)]))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["358"]


def test_any_other_failure_beside_it_is_not(tmp_path):
    r = run(tmp_path, log([chunk(358, LONG, "***Failed", [ENOMEM]),
                           chunk(361, OTHER, "***Failed", ["WARNING: ThreadSanitizer: data race"])],
                          [(358, LONG), (361, OTHER)]))
    assert r.returncode == 1
    assert r.stdout == ""


def test_the_message_must_be_in_the_failed_tests_own_output(tmp_path):
    r = run(tmp_path, log([chunk(357, "A.Passes", "   Passed", [ENOMEM]),
                           chunk(358, LONG, "***Failed", ["test.cpp:160: Failure"])],
                          [(358, LONG)]))
    assert r.returncode == 1


def test_another_errno_is_not_the_environment(tmp_path):
    r = run(tmp_path, log([chunk(358, LONG, "***Failed", [ENOMEM.replace("errno: 12", "errno: 22")])],
                          [(358, LONG)]))
    assert r.returncode == 1


def test_a_log_without_failures_or_a_missing_log(tmp_path):
    assert run(tmp_path, "100% tests passed, 0 tests failed out of 484\n").returncode == 1
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "none.log")],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert "none.log" in r.stderr
