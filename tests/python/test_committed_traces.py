"""Every trace committed under harness/records/ reads back, and the demo's
GPT trace has the shape the demo needs."""
import glob
import os

import pytest

import spillway_record as st
from conftest import HARNESS

TRACES = sorted(glob.glob(os.path.join(HARNESS, "records", "*.spwt")))


def step_peaks(records):
    live, size, peaks = 0, {}, []
    for r in records:
        if isinstance(r, st.Step):
            peaks.append(live)
        elif isinstance(r, st.Alloc):
            size[r.alloc] = r.size
            live += r.size
            if peaks:
                peaks[-1] = max(peaks[-1], live)
        elif isinstance(r, st.Free):
            live -= size.pop(r.alloc)
    return peaks


def test_traces_present():
    names = {os.path.basename(p) for p in TRACES}
    assert {"gpt_varlen.spwt", "resnet50.spwt", "vit_b16.spwt", "llama7b.spwt"} <= names


@pytest.mark.parametrize("path", TRACES, ids=os.path.basename)
def test_trace_reads_back(path):
    assert os.path.getsize(path) < 4 << 20
    meta, records = st.read(path)
    assert meta["source"] == "recorder" and "cost_model" in meta
    steps = [r.step for r in records if isinstance(r, st.Step)]
    assert steps == list(range(meta["steps"]))
    assert sum(isinstance(r, st.Launch) for r in records) > 1000


def test_gpt_varlen_has_one_long_step():
    _, records = st.read(os.path.join(HARNESS, "records", "gpt_varlen.spwt"))
    peaks = step_peaks(records)
    assert len(peaks) >= 4
    top = max(peaks)
    rest = sorted(peaks)[-2]
    assert top >= 1.5 * rest, peaks
