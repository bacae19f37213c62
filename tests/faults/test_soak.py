"""harness/faults/soak.py's draws: a job's number names the same job in every
session (docs/reliability.md, "The soak"), and the caps a sanitizer build's
share takes change nothing but the scale and the devices."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAULTS = os.path.join(ROOT, "harness", "faults")
sys.path.insert(0, FAULTS)
import soak  # noqa: E402

TRACES = soak.DEFAULT_RECORDS


def test_a_jobs_number_still_names_the_same_job():
    # Seed 21's jobs 595 and 656 as session 26's soak printed them.
    d = soak.draw(21, 595, TRACES)
    assert (d["trace"], d["scale"], d["budget"], d["streams"], d["devices"], d["jitter"],
            d["fault"]) == ("vit_b16", 2, "55%", 3, 1, 426277978, "")
    d = soak.draw(21, 656, TRACES)
    assert (d["trace"], d["scale"], d["budget"], d["streams"], d["devices"], d["jitter"],
            d["fault"]) == ("gpt_varlen", 1, "88%", 1, 2, 803384698, "cuMemRelease:235")


def test_caps_change_only_the_scale_and_the_devices():
    capped_any = 0
    for job in range(400):
        full = soak.draw(21, job, TRACES)
        capped = soak.draw(21, job, TRACES, max_scale=2, max_devices=2)
        assert capped["scale"] == min(full["scale"], 2)
        assert capped["devices"] == min(full["devices"], 2)
        rest = {k: v for k, v in full.items() if k not in ("scale", "devices")}
        assert {k: v for k, v in capped.items() if k not in ("scale", "devices")} == rest
        capped_any += capped != full
    assert capped_any > 0  # the caps bit on some of these jobs


def test_a_cap_out_of_range_is_refused_by_name():
    p = subprocess.run([sys.executable, os.path.join(FAULTS, "soak.py"), "--replay", "x",
                        "--shim", "y", "--max-scale", "4"], capture_output=True, text=True)
    assert p.returncode == 2
    assert "--max-scale" in p.stderr and "invalid choice" in p.stderr
