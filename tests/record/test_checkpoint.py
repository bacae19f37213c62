"""harness/record.py on activation-checkpointed models (issue 15 item 6).

pytest, run by ctest as record_checkpoint_pytest with REPLAY_BIN_FOR_TESTS
pointing at this build's spillway-replay (else build/bin/spillway-replay; the
replay test is skipped when there is none).  The model is
harness/models/gpt_checkpoint.py: a GPT decoder whose blocks run under
torch.utils.checkpoint.checkpoint(block, x, use_reentrant=<reentrant>), and
the same model with checkpoint=0 as the reference.

- Both forms record, with real compute (torch 1.13 used to refuse the
  non-reentrant one: its recomputation detach()es a saved wrapped number,
  which a TorchDispatchMode cannot re-dispatch as it receives it).
- The recording is checkpointing's: the backward is the reference's backward
  plus exactly one more run of every block's forward (the recomputation), the
  forward keeps far fewer bytes live, nothing is left over after a step, and a
  meta recording equals the real one.
- A checkpointed recording at the model's default size replays through the
  shim at 40% of its unconstrained peak with every byte checked (all the
  replayer's times are simulated).
"""
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "harness"))
import record as rt  # noqa: E402
import spillway_record as st  # noqa: E402

MODEL = str(REPO / "harness" / "models" / "gpt_checkpoint.py")
REPLAY = Path(os.environ.get("REPLAY_BIN_FOR_TESTS", REPO / "build" / "bin" / "spillway-replay"))
TINY = dict(steps=2, batch=4, seq=64, vocab=64, d=32, layers=2, heads=2)
FORMS = [pytest.param(0, id="use_reentrant=False"), pytest.param(1, id="use_reentrant=True")]


def record(path, meta_mode=False, **kwargs):
    summary = rt.record(rt.load_model_file(MODEL, kwargs), str(path), meta_mode=meta_mode)
    return summary, st.read(str(path))


def launches(records, step, phase):
    """Kernel names launched in one phase of one step, as a multiset."""
    names, cur_step, cur_phase, out = {}, None, None, Counter()
    for r in records:
        if isinstance(r, st.String):
            names[r.id] = r.text
        elif isinstance(r, st.Step):
            cur_step = r.step
        elif isinstance(r, st.Phase):
            cur_phase = r.phase
        elif isinstance(r, st.Launch) and (cur_step, cur_phase) == (step, phase):
            out[names[r.name]] += 1
    return out


def live_bytes(records):
    """Live bytes at each STEP and at the end, and the bytes the forward phase of each step left live."""
    size, live, at_step, fwd_kept, fwd_start = {}, 0, [], [], None
    for r in records:
        if isinstance(r, st.Alloc):
            size[r.alloc] = r.size
            live += r.size
        elif isinstance(r, st.Free):
            live -= size[r.alloc]
        elif isinstance(r, st.Step):
            at_step.append(live)
        elif isinstance(r, st.Phase):
            if r.phase == st.PHASE_FORWARD:
                fwd_start = live
            elif r.phase == st.PHASE_BACKWARD:
                fwd_kept.append(live - fwd_start)
    return at_step + [live], fwd_kept


def activation_peak(records, step):
    """The largest sum of live allocations in one step's forward and backward, less what was live at its start."""
    size, live, base, top, cur_step, cur_phase = {}, 0, 0, 0, None, None
    for r in records:
        if isinstance(r, st.Step):
            cur_step, base = r.step, live
        elif isinstance(r, st.Phase):
            cur_phase = r.phase
        elif isinstance(r, st.Alloc):
            size[r.alloc] = r.size
            live += r.size
            if cur_step == step and cur_phase in (st.PHASE_FORWARD, st.PHASE_BACKWARD):
                top = max(top, live - base)
        elif isinstance(r, st.Free):
            live -= size[r.alloc]
    return top


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    _, (_, plain) = record(d / "plain.spwt", checkpoint=0, **TINY)
    _, (_, headless) = record(d / "noblocks.spwt", checkpoint=0, **dict(TINY, layers=0))
    return plain, headless


@pytest.mark.parametrize("reentrant", FORMS)
def test_records_checkpointing(tmp_path, reference, reentrant):
    plain, noblocks = reference
    _, (meta, recs) = record(tmp_path / "ck.spwt", checkpoint=1, reentrant=reentrant, **TINY)
    assert meta["use_reentrant"] is bool(reentrant) and meta["checkpoint"] is True
    last = TINY["steps"] - 1
    # the forward is the plain model's; the blocks' share of it is what the
    # model without blocks does not launch
    fwd = launches(recs, last, st.PHASE_FORWARD)
    assert fwd == launches(plain, last, st.PHASE_FORWARD)
    blocks_fwd = fwd - launches(noblocks, last, st.PHASE_FORWARD)
    assert sum(blocks_fwd.values()) > 20 * TINY["layers"]
    # backward = plain backward + every block's forward once more (recomputed)
    bwd, plain_bwd = launches(recs, last, st.PHASE_BACKWARD), launches(plain, last, st.PHASE_BACKWARD)
    assert bwd - plain_bwd == blocks_fwd, "recomputation not recorded as the blocks' forward"
    assert plain_bwd - bwd == Counter(), "a backward launch of the plain model is missing"
    # memory: the forward keeps only the blocks' inputs, not their saved tensors
    ck_steps, ck_kept = live_bytes(recs)
    plain_steps, plain_kept = live_bytes(plain)
    assert ck_steps == plain_steps            # parameters, AdamW state; nothing left over
    for ck, pl in zip(ck_kept, plain_kept):
        assert ck < 0.5 * pl, f"checkpointed forward keeps {ck} bytes live, plain {pl}"
    ck_peak, plain_peak = activation_peak(recs, last), activation_peak(plain, last)
    assert ck_peak < 0.75 * plain_peak, f"activation peak {ck_peak} bytes, plain {plain_peak}"


@pytest.mark.parametrize("reentrant", FORMS)
def test_meta_equals_real(tmp_path, reentrant):
    kw = dict(TINY, checkpoint=1, reentrant=reentrant)
    s1, (_, real) = record(tmp_path / "real.spwt", **kw)
    s2, (_, meta) = record(tmp_path / "meta.spwt", meta_mode=True, **kw)
    assert len(real) == len(meta)
    for i, (a, b) in enumerate(zip(real, meta)):
        assert a == b, f"record {i}: real {a} meta {b}"
    assert s1["step_peak_bytes"] == s2["step_peak_bytes"]


@pytest.mark.skipif(not REPLAY.exists(), reason=f"{REPLAY} not built")
@pytest.mark.parametrize("reentrant", FORMS)
def test_replays_at_40_percent(tmp_path, reentrant):
    """The model's default size (meta: shapes only, the same records as a real
    run), 2 steps, through the shim at 40% of the unconstrained peak."""
    trace, report = tmp_path / "ck.spwt", tmp_path / "ck.json"
    record(trace, meta_mode=True, steps=2, checkpoint=1, reentrant=reentrant)
    run = subprocess.run([str(REPLAY), str(trace), "--budget", "40%", "--json", str(report)],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "integrity ok" in run.stdout, run.stdout
    r = json.loads(report.read_text())
    assert r["steps_completed"] == r["steps_in_record"] == 2
    assert not r["oom"] and r["within_budget"]
    assert r["integrity_ok"] is True and not r.get("first_mismatch")
    assert r["bytes_checked"] > 0
    # 40% is below what the trace itself needs: the shim had to move blocks
    assert r["budget_bytes"] < r["record_peak_live_bytes"]
    assert r["bytes_device_to_host"] > 0 and r["bytes_host_to_device"] > 0
