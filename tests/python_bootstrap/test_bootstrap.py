"""The Python bootstrap (design.md 6): libspillway.so preloaded into Python installs
itself as torch's allocator once torch is imported, and touches nothing else."""
import os

from conftest import PYTHON


def installs(calls):
    return [c for c in calls if c["call"] == "CUDAPluggableAllocator"]


def changes(calls):
    return [c for c in calls if c["call"] == "change_current_allocator"]


def warnings_in(text):
    return [l for l in text.splitlines() if "SpillwayWarning" in l or "[spillway W]" in l]


def test_import_torch_installs_the_allocator_once_with_the_absolute_path(spw):
    # A relative LD_PRELOAD, as a user would type it from the build directory.
    env = spw.environ(preload=False)
    env["LD_PRELOAD"] = os.path.relpath(spw.lib, spw.build)
    r = spw.python("import torch\nimport torch.cuda\nimport importlib; importlib.reload(torch)\n"
                   "import spillway, spillway._bootstrap as b\n"
                   "print(spillway.enabled(), b.installed)", env, cwd=spw.build)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert r.stdout.split() == ["True", "True"]
    calls = spw.calls()
    assert [c["args"] for c in installs(calls)] == [[os.path.realpath(spw.lib), "spillway_malloc",
                                                     "spillway_free"]]
    assert [c["args"] for c in changes(calls)] == [["CUDAPluggableAllocator", True]]
    # The allocator is installed right after torch's own import finished, before user code.
    assert [c["call"] for c in calls][:3] == ["import torch", "CUDAPluggableAllocator",
                                              "change_current_allocator"]


def test_importing_torch_does_not_start_spillway(spw):
    # Nothing is allocated: the shim never starts, so no exit summary, no driver call,
    # and the stats stay zero.
    r = spw.python("import torch, spillway; s = spillway.stats(); print(s['mallocs'], "
                   "s['budget_bytes'])", spw.environ(SPILLWAY_STATS="stats.json"))
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert r.stdout.split() == ["0", "0"]
    assert not os.path.exists(os.path.join(spw.tmp, "stats.json"))


def test_the_bootstrap_directory_goes_first_on_pythonpath_once(spw):
    code = ("import os, subprocess, sys\n"
            "print(os.environ['PYTHONPATH'])\n"
            "sys.stdout.flush()\n"
            "subprocess.run([sys.executable, '-c', "
            "'import os, sys; print(os.environ[\"PYTHONPATH\"]); print(\"torch\" in sys.modules)'])\n")
    r = spw.python(code, spw.environ())
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    boot = os.path.realpath(spw.bootstrap)
    parent, child, torch_loaded = r.stdout.splitlines()
    assert parent == boot + ":" + spw.fake_torch
    assert child == parent  # a preloaded child inherits it and does not add it again
    assert torch_loaded == "False"  # nothing imports torch on its own


def test_an_existing_sitecustomize_still_runs(spw):
    site = os.path.join(spw.tmp, "site")
    os.makedirs(site)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write("import builtins, sys\nbuiltins.USER_SITECUSTOMIZE = 'ran'\nMARK = 42\n"
                "sys.path.insert(0, '/nonexistent-site-entry')\n")
    env = spw.environ(pythonpath=site + ":" + spw.fake_torch)
    r = spw.python("import builtins, sitecustomize, sys, torch\n"
                   "print(builtins.USER_SITECUSTOMIZE, sitecustomize.MARK, [p for p in sys.path if p][0],\n"
                   "      %r in sys.path)" % os.path.realpath(spw.bootstrap), env)
    assert r.returncode == 0, r.stderr
    # Its own changes to sys.path are kept, and the bootstrap directory stays on it.
    assert r.stdout.split() == ["ran", "42", "/nonexistent-site-entry", "True"]
    assert len(installs(spw.calls())) == 1


def test_an_existing_sitecustomize_that_fails_is_reported_as_python_would(spw):
    site = os.path.join(spw.tmp, "site")
    os.makedirs(site)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write("raise ValueError('broken site')\n")
    env = spw.environ(pythonpath=site + ":" + spw.fake_torch)
    r = spw.python("import torch; print('ran')", env)
    assert r.returncode == 0, r.stderr
    assert "Error in sitecustomize" in r.stderr and "broken site" in r.stderr
    assert r.stdout.strip() == "ran"
    assert len(installs(spw.calls())) == 1  # the hook was armed before the chained one ran


def test_cuda_already_initialized_gives_one_warning_and_no_install(spw):
    r = spw.python("import torch, spillway; print(spillway.enabled())",
                   spw.environ(FAKE_TORCH_CUDA_INITIALIZED=1))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
    w = warnings_in(r.stderr)
    assert len(w) == 1, r.stderr
    assert "CUDA was initialized" in w[0] and "PyTorch's own allocator" in w[0]
    assert installs(spw.calls()) == [] and changes(spw.calls()) == []


def test_a_torch_without_pluggable_allocators_gives_one_warning(spw):
    r = spw.python("import torch; print('ran')", spw.environ(FAKE_TORCH_OLD=1))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ran"
    w = warnings_in(r.stderr)
    assert len(w) == 1 and "CUDAPluggableAllocator" in w[0], r.stderr
    assert changes(spw.calls()) == []


def test_a_warning_never_fails_the_job_even_under_W_error(spw):
    r = spw.run([PYTHON, "-W", "error", "-c", "import torch; print('ran')"],
                spw.environ(FAKE_TORCH_CUDA_INITIALIZED=1))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ran"
    assert len(warnings_in(r.stderr)) == 1, r.stderr


def test_a_bad_budget_raises_at_import_torch_naming_it(spw):
    env = spw.environ(SPILLWAY_GPU_BUDGET="lots")
    r = spw.python("import torch", env)
    assert r.returncode == 1, r.stderr
    assert "spillway.ConfigError" in r.stderr
    assert "SPILLWAY_GPU_BUDGET='lots' is not valid" in r.stderr
    assert changes(spw.calls()) == []
    # An exception the job can catch (the shim itself would end the process with exit 2).
    r = spw.python("import spillway\ntry:\n    import torch\nexcept spillway.ConfigError as e:\n"
                   "    print('caught:', e)\n", env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("caught: spillway: SPILLWAY_GPU_BUDGET='lots'")


def test_a_misspelled_variable_raises_with_the_suggestion(spw):
    r = spw.python("import torch", spw.environ(SPILLWAY_GPU_BUGDET="40GiB"))
    assert r.returncode == 1
    assert "did you mean SPILLWAY_GPU_BUDGET?" in r.stderr


def test_a_bad_setting_does_not_touch_python_without_torch(spw):
    r = spw.python("print('ran')", spw.environ(SPILLWAY_GPU_BUDGET="lots"))
    assert (r.returncode, r.stdout.strip(), r.stderr) == (0, "ran", "")


def test_a_python_child_without_the_preload_is_untouched(spw):
    # It inherits PYTHONPATH (bootstrap first) but not the library: nothing happens.
    code = ("import os, subprocess, sys\n"
            "env = dict(os.environ); del env['LD_PRELOAD']\n"
            "sys.exit(subprocess.run([sys.executable, '-c', "
            "'import torch, spillway; print(spillway.enabled())'], env=env).returncode)\n")
    r = spw.python(code, spw.environ(FAKE_TORCH_CUDA_INITIALIZED=1))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
    assert r.stderr == ""
    assert installs(spw.calls()) == []


def test_a_non_python_process_is_untouched(spw):
    env = spw.environ(SPILLWAY_GPU_BUDGET="lots")
    r = spw.run(["/bin/sh", "-c", "true"], env)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    r = spw.run(["/bin/sh", "-c", 'printf "%s" "$PYTHONPATH"'], env)
    assert (r.returncode, r.stdout, r.stderr) == (0, spw.fake_torch, "")
    # Without any driver on the path either.
    r = spw.run(["/bin/sh", "-c", "true"], spw.environ(sim=False))
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_optimizer_steps_mark_steps_once_cuda_is_in_use(spw):
    code = ("import torch, spillway\n"
            "a, b = torch.optim.Optimizer(), torch.optim.Optimizer()\n"
            "a.step(); b.step()\n"                       # CUDA not initialized: no mark
            "print(spillway.stats()['steps'])\n"
            "torch.cuda._lazy_init()\n"
            "for _ in range(3):\n"
            "    a.step(); b.step()\n"                   # one mark per iteration, not two
            "print(spillway.stats()['steps'])\n"
            "spillway.mark_step()\n"                     # by hand: automatic marking stops
            "a.step()\n"
            "print(spillway.stats()['steps'])\n")
    r = spw.python(code, spw.environ(SPILLWAY_LOG_LEVEL="warn"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "3", "4"]
    assert [c["call"] for c in spw.calls()].count("register_optimizer_step_post_hook") == 1


MEMORY_API = """
import ctypes, json, torch, spillway
lib = spillway._load()
MiB = 1 << 20
a = lib.spillway_malloc(4 * MiB, 0, None)
b = lib.spillway_malloc(8 * MiB, 0, None)
lib.spillway_free(b, 8 * MiB, 0, None)
out = {"allocated": torch.cuda.memory_allocated(), "peak": torch.cuda.max_memory_allocated(),
       "reserved": torch.cuda.memory_reserved(), "peak_reserved": torch.cuda.max_memory_reserved()}
torch.cuda.reset_peak_memory_stats()
out["peak_after_reset"] = torch.cuda.max_memory_allocated()
out["same_in_memory_module"] = torch.cuda.memory.max_memory_allocated(0)
torch.cuda.reset_max_memory_allocated()  # the deprecated spelling
stats = torch.cuda.memory_stats()
out["keys"] = sorted(stats)
out["process_peak"] = spillway.stats()["peak_live_bytes"]
out["summary"] = torch.cuda.memory_summary()
print(json.dumps(out))
"""


def test_torchs_memory_functions_report_spillways_counters(spw):
    r = spw.python(MEMORY_API, spw.environ(SPILLWAY_CUPTI="off", SPILLWAY_LOG_LEVEL="error"))
    assert r.returncode == 0, r.stderr
    assert warnings_in(r.stderr) == []
    import json
    out = json.loads(r.stdout.strip().splitlines()[-1])
    MiB = 1 << 20
    assert out["allocated"] == 4 * MiB
    assert out["peak"] == 12 * MiB
    assert out["reserved"] >= 4 * MiB and out["peak_reserved"] >= 12 * MiB
    # The peak starts again from now; the process's own peak (the exit summary's) stays.
    assert out["peak_after_reset"] == 4 * MiB
    assert out["same_in_memory_module"] == 4 * MiB
    assert out["process_peak"] == 12 * MiB
    assert "allocated_bytes.all.current" in out["keys"]
    assert "spillway.evicted_bytes" in out["keys"] and "spillway.host_bytes.peak" in out["keys"]
    summary = out["summary"]
    assert "spillway CUDA memory summary" in summary
    assert "Allocated memory" in summary and "   4.0 MiB" in summary
    assert "Evicted / restored" in summary


def test_without_spillway_torchs_memory_functions_are_left_alone(spw):
    # The library is not preloaded: nothing is installed, nothing is replaced.
    r = spw.python("import torch\ntry:\n    torch.cuda.memory_allocated()\nexcept RuntimeError as e:\n"
                   "    print('raised', 'getDeviceStats' in str(e))\n",
                   spw.environ(preload=False))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["raised", "True"]


def test_pytorch_cuda_alloc_conf_is_named_once_as_having_no_effect(spw):
    r = spw.python("import torch\nimport importlib; importlib.reload(torch)\nprint('ok')",
                   spw.environ(PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok"]
    w = warnings_in(r.stderr)
    assert len(w) == 1, r.stderr
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in w[0] and "no effect" in w[0]


END_OF_JOB = """
import os, signal, spillway
lib = spillway._load()
lib.spillway_malloc(4 << 20, 0, None)
if "{how}" == "exception":
    raise RuntimeError("the job failed")
os.kill(os.getpid(), signal.SIGTERM)  # Python leaves SIGTERM at its default
"""


def test_a_python_job_ending_in_an_exception_or_sigterm_leaves_complete_statistics(spw):
    # Issue 15 item 4 (docs/profiling.md, "When the job ends"): the statistics
    # file is whole, and the exit summary logged, however a Python job ends.
    import json
    import signal
    for how, code in (("exception", 1), ("sigterm", -signal.SIGTERM)):
        stats = os.path.join(spw.tmp, f"stats-{how}.json")
        r = spw.python(END_OF_JOB.replace("{how}", how),
                       spw.environ(SPILLWAY_CUPTI="off", SPILLWAY_STATS=stats))
        assert r.returncode == code, (how, r.returncode, r.stderr)
        assert "peak resident 4.0 MiB" in r.stderr, (how, r.stderr)
        with open(stats) as f:
            s = json.load(f)
        assert s["mallocs"] == 1 and s["peak_live_bytes"] == 4 << 20, (how, s)
