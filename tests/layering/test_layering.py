"""The layering of docs/architecture.md holds in the tree, and the check that
says so fails when a forbidden include appears."""
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHECK = ROOT / "scripts" / "check_layering.py"
FOLDERS = ["base", "cuda", "policy", "trace", "cupti_trace", "observe", "shim"]


def run(root):
    return subprocess.run([sys.executable, str(CHECK), "--root", str(root)],
                          capture_output=True, text=True)


def test_the_tree_keeps_its_layers():
    r = run(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert " 0 problems" in r.stdout


def copy_tree(tmp_path):
    for f in FOLDERS:
        shutil.copytree(ROOT / f, tmp_path / f)
    return tmp_path


def test_an_include_from_the_shim_in_cupti_trace_is_refused(tmp_path):
    root = copy_tree(tmp_path)
    tracker = root / "cupti_trace" / "tracker.cpp"
    tracker.write_text('#include "allocator.h"\n' + tracker.read_text())
    r = run(root)
    assert r.returncode == 1
    assert 'cupti_trace/tracker.cpp: includes "allocator.h" from shim/' in r.stdout


def test_an_include_from_observe_in_base_is_refused(tmp_path):
    root = copy_tree(tmp_path)
    log = root / "base" / "log.h"
    log.write_text(log.read_text() + '\n#include "events.h"\n')
    r = run(root)
    assert r.returncode == 1
    assert 'base/log.h: includes "events.h" from observe/' in r.stdout


def test_a_folder_without_its_readme_is_refused(tmp_path):
    root = copy_tree(tmp_path)
    (root / "cuda" / "README.md").unlink()
    r = run(root)
    assert r.returncode == 1
    assert "cuda/README.md: missing" in r.stdout
