"""The CPU recorder (harness/record.py) and the model zoo (harness/models)."""
import os
import subprocess
import sys
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

import record as rt  # noqa: E402
import spillway_record as st  # noqa: E402
from conftest import HARNESS  # noqa: E402

MODELS = os.path.join(HARNESS, "models")

MLP = '''
import torch
def build(batch=8, steps=3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    batches = [(torch.randn(batch, 32), torch.randint(0, 10, (batch,))) for _ in range(steps)]
    return {"model": model, "batches": batches, "loss_fn": torch.nn.functional.cross_entropy}
'''

GPT_SMALL = dict(steps=3, batch=2, vocab=128, d=32, layers=2, heads=2, median=12, lo=4, hi=24,
                 long_step=1, long_len=40)


def events(records, skip_setup=True):
    """Signed sizes: +size at ALLOC, -size at FREE (from the first STEP on if skip_setup)."""
    size, out, started = {}, [], not skip_setup
    for r in records:
        if isinstance(r, st.Step):
            started = True
        elif isinstance(r, st.Alloc):
            size[r.alloc] = r.size
            if started:
                out.append(r.size)
        elif isinstance(r, st.Free) and started:
            out.append(-size[r.alloc])
    return out


def profiled_record(job, path):
    """Records `job` while PyTorch's own profiler logs every CPU allocator call."""
    from torch.autograd import profiler
    with profiler.profile(profile_memory=True, use_kineto=True) as prof:
        rt.record(job, str(path))
    mem = [e for e in prof.kineto_results.events() if e.name() == "[memory]"]
    times = [e.start_us() for e in mem]
    assert times == sorted(times)
    return [e.nbytes() for e in mem]


def check_against_allocator(recorded, allocator):
    """The recorder's allocation/free sequence must be the allocator's, in order.

    The allocator (seen by the profiler) also serves host scalars (<= 8 bytes:
    wrapped Python numbers, optimizer step counts, profiler handles: host
    memory on a GPU job) and kernel-internal scratch, which is no tensor
    storage.  So: sizes <= 8 are left out of both; the recorded sequence must
    be a subsequence of the allocator's, frees between two allocations
    matching as a multiset (the recorder sees them together); and every
    allocator event left over is scratch: an allocation freed again before
    the next recorded event, or a free of something allocated before
    recording began.
    """
    rec = [x for x in recorded if abs(x) > 8]
    alloc = [x for x in allocator if abs(x) > 8]
    tokens = []
    for x in rec:
        if x < 0 and tokens and isinstance(tokens[-1], Counter):
            tokens[-1][-x] += 1
        else:
            tokens.append(Counter({-x: 1}) if x < 0 else x)
    j, extra = 0, []
    for i, x in enumerate(alloc):
        t = tokens[j] if j < len(tokens) else None
        if isinstance(t, Counter) and x < 0 and t[-x] > 0:
            t[-x] -= 1
            if not +t:
                j += 1
        elif isinstance(t, int) and x == t:
            j += 1
        else:
            extra.append((j, x))
    assert j == len(tokens), f"recorded event {j} of {len(tokens)} not found in the allocator's order"
    # leftovers: scratch pairs inside one gap between recorded events, or frees after the end
    open_scratch = Counter()
    for gap, x in extra:
        if gap == len(tokens):
            assert x < 0
            continue
        if x > 0:
            open_scratch[(gap, x)] += 1
        else:
            assert open_scratch[(gap, -x)] > 0, f"allocator free of {-x} bytes not recorded (gap {gap})"
            open_scratch[(gap, -x)] -= 1
    assert not +open_scratch, f"allocations never recorded: {+open_scratch}"
    return len(rec), len(extra)


@pytest.mark.parametrize("which", ["mlp", "gpt"])
def test_order_matches_allocator(tmp_path, which):
    if which == "mlp":
        f = tmp_path / "mlp.py"
        f.write_text(MLP)
        job = rt.load_model_file(str(f))
    else:
        job = rt.load_model_file(os.path.join(MODELS, "gpt_varlen.py"), GPT_SMALL)
    out = tmp_path / "t.spwt"
    allocator = profiled_record(job, out)
    _, records = st.read(out)
    matched, extra = check_against_allocator(events(records), allocator)
    assert matched > 50
    # every storage of a parameter is one ALLOC before the first step
    params = {p.storage().data_ptr() for p in job["model"].parameters()}
    setup = [r for r in records[:next(i for i, r in enumerate(records) if isinstance(r, st.Step))]
             if isinstance(r, st.Alloc)]
    assert len(setup) == len(params) + sum(1 for _ in job["model"].buffers())


def test_recorder_matches_lifetimes(tmp_path):
    """What stays live after the steps is exactly the parameters and AdamW's two
    moments (everything else was freed), and the step structure is complete."""
    f = tmp_path / "mlp.py"
    f.write_text(MLP)
    job = rt.load_model_file(str(f))
    out = tmp_path / "t.spwt"
    summary = rt.record(job, str(out))
    _, records = st.read(out)
    live = {}
    for r in records:
        if isinstance(r, st.Alloc):
            live[r.alloc] = r.size
        elif isinstance(r, st.Free):
            del live[r.alloc]
    # what remains live: parameters and the optimizer's two moments per parameter
    nparam = sum(p.numel() * p.element_size() for p in job["model"].parameters())
    assert sum(live.values()) == 3 * nparam
    phases = [r.phase for r in records if isinstance(r, st.Phase)]
    assert phases == [0, 1, 2, 3, 0] * 3
    assert [r.step for r in records if isinstance(r, st.Step)] == [0, 1, 2]
    assert summary["launches"] == sum(isinstance(r, st.Launch) for r in records)


def test_unseen_model_file_cli(tmp_path):
    f = tmp_path / "never_seen.py"
    f.write_text(MLP)
    out = tmp_path / "never_seen.spwt"
    r = subprocess.run([sys.executable, os.path.join(HARNESS, "record.py"), "--model", str(f),
                        "--out", str(out), "--steps", "2", "-q"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    meta, records = st.read(out)
    assert meta["source"] == "recorder" and meta["model"] == "never_seen" and meta["steps"] == 2
    assert meta["cost_model"]["hbm_bytes_per_s"] == 3.0e12
    names = {r.id: r.text for r in records if isinstance(r, st.String)}
    launched = {names[r.name] for r in records if isinstance(r, st.Launch)}
    assert {"aten::addmm", "aten::mm", "aten::relu", "aten::addcdiv_"} <= launched
    assert all(r.duration_ns >= rt.COST_MODEL["launch_floor_ns"] for r in records
               if isinstance(r, st.Launch))
    # touches: inputs read, outputs written, in-place read-and-write
    modes = {(names[r.name], t.mode) for r in records if isinstance(r, st.Launch) for t in r.touches}
    assert ("aten::relu", st.WRITE) in modes and ("aten::relu", st.READ) in modes
    assert ("aten::addcdiv_", st.READ_WRITE) in modes
    copies = [r for r in records if isinstance(r, st.Copy)]
    assert len(copies) == 4 and all(c.kind == st.COPY_H2D for c in copies)


@pytest.mark.parametrize("model,kwargs", [
    ("gpt_varlen.py", GPT_SMALL),
    ("llama7b.py", dict(layers=2, d=64, heads=4, ffn=160, vocab=100, seq=32, device="cpu",
                        dtype="float32")),
    ("resnet50.py", dict(batch=2, resolution=32, classes=10)),
])
def test_meta_equals_real(tmp_path, model, kwargs):
    path = os.path.join(MODELS, model)
    real, meta = tmp_path / "real.spwt", tmp_path / "meta.spwt"
    s1 = rt.record(rt.load_model_file(path, kwargs), str(real), 2)
    s2 = rt.record(rt.load_model_file(path, kwargs), str(meta), 2, meta_mode=True)
    m1, r1 = st.read(real)
    m2, r2 = st.read(meta)
    assert m1["device"] == "cpu" and m2["device"].startswith("meta")
    assert len(r1) == len(r2)
    for i, (a, b) in enumerate(zip(r1, r2)):
        assert a == b, f"record {i}: real {a} meta {b}"
    assert s1["step_peak_bytes"] == s2["step_peak_bytes"]


def test_cost_model():
    a = torch.empty(1024, 4096, device="meta", dtype=torch.bfloat16)
    b = torch.empty(4096, 8192, device="meta", dtype=torch.bfloat16)
    out = torch.empty(1024, 8192, device="meta", dtype=torch.bfloat16)
    flops, cls = rt.op_flops("mm", (a, b), [out])
    assert (flops, cls) == (2 * 1024 * 4096 * 8192, "matmul")
    ns = rt.op_duration_ns("mm", (a, b), [out], 0, torch.bfloat16)
    assert ns == int(flops / 790e12 * 1e9) + rt.COST_MODEL["launch_floor_ns"]
    # an elementwise op over 3 GB is bandwidth bound: 1 ms
    x = torch.empty(10, device="meta")
    assert rt.op_duration_ns("add", (x, x), [x], 3 * 10**9, torch.float32) == 10**6 + 2000
