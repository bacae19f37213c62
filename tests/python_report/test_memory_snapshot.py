"""harness/to_memory_snapshot.py (pytest; run by ctest as part of python_report).

A small record written here with harness/spillway_record.py's writer, and the
committed harness/records/gpt_varlen.spwt, are converted to PyTorch's memory
snapshot, read back with the converter's own reader (`load`, which validates
the layout and replays the trace) and checked against the record; where
`import torch` works, PyTorch's own torch.cuda._memory_viz functions are run
on the result (torch 2's `trace_plot`, `segment_plot`, `segsum`, `trace` where
they exist; 1.13's `segments`, `memory`, `stats`, `compare`). No GPU needed."""

import pickle
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "harness"))
import spillway_record as st  # noqa: E402
import to_memory_snapshot as ms  # noqa: E402

TOOL = REPO / "harness" / "to_memory_snapshot.py"
GPT = REPO / "harness" / "records" / "gpt_varlen.spwt"
KIB, MIB = 1 << 10, 1 << 20
NATIVE = "libtorch_cuda.so!at::native::empty_cuda+0x1f"

# id -> (size, stream) of every allocation of the small record; LIVE: not freed.
SIZES = {1: (4 * MIB, 0), 2: (1000, 0), 3: (3 * MIB + 1, 0), 4: (300 * KIB, 0),
         5: (700 * KIB, 0), 6: (100, 1), 7: (200 * KIB, 0), 8: (6 * MIB, 0), 9: (2 * MIB, 1)}
LIVE = {1, 2, 5, 6, 7, 9}


def write_record(path: Path) -> Path:
    """Set-up (a weight, a bias), then two steps with large and small blocks
    on two streams, launches whose device time comes later (DURATION), a
    copy, and frees that leave a hole the next small block reuses."""
    with st.Writer(str(path), meta={"source": "test_memory_snapshot"}) as w:
        empty, mm, native = w.string("aten::empty"), w.string("aten::mm"), w.string(NATIVE)
        w.alloc(1, SIZES[1][0], 0, empty)
        w.alloc(2, SIZES[2][0], 0, 0)                         # no site
        w.launch(0, empty, 5000, [(1, 0, SIZES[1][0], st.WRITE)])
        w.step(0)
        w.phase(st.PHASE_FORWARD)
        w.alloc(3, SIZES[3][0], 0, mm)
        w.alloc(4, SIZES[4][0], 0, mm)
        w.alloc(5, SIZES[5][0], 0, native)
        w.alloc(6, SIZES[6][0], 1, mm)
        late = w.launch(0, mm, 0, [(3, 0, SIZES[3][0], st.READ), (1, 0, SIZES[1][0], st.READ)])
        w.copy(0, st.COPY_D2H, 4096, 7000, (0, 0), (3, 0))
        w.duration(late, 250_000)                            # the launch's time, known later
        w.phase(st.PHASE_BACKWARD)
        w.free(3)
        w.free(4)
        w.alloc(7, SIZES[7][0], 0, mm)                       # into 4's hole
        w.step(1)
        w.phase(st.PHASE_OPTIMIZER)
        w.alloc(8, SIZES[8][0], 0, mm)
        w.alloc(9, SIZES[9][0], 1, mm)                       # exactly the granule: large
        w.launch(1, mm, 1_000_000, [(8, 0, SIZES[8][0], st.READ_WRITE)])
        w.free(8, stream=1)
    return path


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    return write_record(tmp_path_factory.mktemp("rec") / "small.spwt")


def run_tool(*args):
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def snap_path(record, tmp_path_factory):
    out = tmp_path_factory.mktemp("snap") / "small.pickle"
    r = run_tool(record, "-o", out)
    assert r.returncode == 0, r.stderr
    assert "9 allocations and 3 frees over 2 steps" in r.stdout, r.stdout
    assert "no evictions or restores" in r.stdout and ms.MEMORY_VIZ_URL in r.stdout
    return out


@pytest.fixture(scope="module")
def snap(snap_path):
    return ms.load(snap_path)


def by_alloc(trace):
    """alloc id -> its trace entries, from the 'allocation N, ...' frame."""
    out = {}
    for e in trace:
        for f in e["frames"]:
            if f["filename"] == "record":
                out.setdefault(int(f["name"].split(",")[0].split()[1]), []).append(e)
    return out


def test_every_allocation_and_free_of_the_record_is_in_the_trace(record, snap):
    counts = st.check(str(record))["counts"]
    trace = snap["device_traces"][0]
    actions = Counter(e["action"] for e in trace)
    # A lost allocation or free fails here.
    assert actions["alloc"] == counts["Alloc"] == 9
    assert actions["free_requested"] == actions["free_completed"] == counts["Free"] == 3
    # Large blocks: a segment each, freed with them; small ones: a chunk per stream.
    large = {i for i, (size, _) in SIZES.items() if size >= MIB}
    assert actions["segment_alloc"] == len(large) + 2 and actions["segment_free"] == 2
    entries = by_alloc(trace)
    assert set(entries) == set(SIZES)
    for i, (size, stream) in SIZES.items():
        seq = [e["action"] for e in entries[i]]
        freed = ["free_requested", "free_completed"] + (["segment_free"] if i in large else [])
        # A small block that opens a chunk (2, then 6 on stream 1) lends it its frames.
        assert seq == (["segment_alloc"] if i in large | {2, 6} else []) + ["alloc"] + \
            ([] if i in LIVE else freed), (i, seq)
        alloc = next(e for e in entries[i] if e["action"] == "alloc")
        assert alloc["size"] == size and alloc["stream"] == stream
        if i in large:
            seg = entries[i][0]
            assert seg["addr"] == alloc["addr"] and seg["size"] == -(-size // (2 * MIB)) * 2 * MIB
    # free_requested is right before its free_completed (the viewer folds the two).
    for k, e in enumerate(trace):
        if e["action"] == "free_requested":
            nxt = trace[k + 1]
            assert (nxt["action"], nxt["addr"], nxt["size"]) == ("free_completed", e["addr"], e["size"])


def test_the_end_state_holds_exactly_the_live_allocations(snap):
    blocks = [(b, s) for s in snap["segments"] for b in s["blocks"]]
    active = [(b, s) for b, s in blocks if b["state"] == "active_allocated"]
    ids = sorted(int(b["frames"][-1]["name"].split(",")[0].split()[1]) for b, _ in active)
    assert ids == sorted(LIVE)
    for b, s in active:
        i = int(b["frames"][-1]["name"].split(",")[0].split()[1])
        assert b["requested_size"] == SIZES[i][0] and s["stream"] == SIZES[i][1]
        assert s["address"] <= b["address"] and b["address"] + b["size"] <= s["address"] + s["total_size"]
        assert s["segment_type"] == ("large" if SIZES[i][0] >= MIB else "small")
    # Small blocks of a stream share a 2 MiB chunk; stream 1's has its own.
    small = {int(b["frames"][-1]["name"].split(",")[0].split()[1]): s["address"]
             for b, s in active if s["segment_type"] == "small"}
    assert small[2] == small[5] == small[7] != small[6]
    for s in snap["segments"]:
        assert s["total_size"] == sum(b["size"] for b in s["blocks"])
        assert s["requested_size"] == sum(b["requested_size"] for b in s["blocks"]
                                          if b["state"] == "active_allocated")
        if s["segment_type"] == "small":
            assert s["total_size"] == 2 * MIB
    assert snap["spillway"]["counts"]["live_at_end"] == len(LIVE)
    assert snap["spillway"]["evictions_in_record"] is False


def test_layout_times_and_frames(snap):
    trace = snap["device_traces"][0]
    entries = by_alloc(trace)
    alloc = {i: next(e for e in es if e["action"] == "alloc") for i, es in entries.items()}
    # 7 reuses the hole 4 left at the start of the chunk (first fit, 512-byte units).
    assert alloc[7]["addr"] == alloc[4]["addr"] == alloc[2]["addr"] + 1024
    assert alloc[5]["addr"] == alloc[4]["addr"] + 300 * KIB
    assert all(e["addr"] % 512 == 0 for e in trace)
    assert all(s["address"] % (2 * MIB) == 0 and s["address"] >= ms.BASE_ADDRESS for s in snap["segments"])
    # time_us: the running sum of device times, the late DURATION included.
    assert alloc[1]["time_us"] == 0 and alloc[3]["time_us"] == 5
    assert alloc[7]["time_us"] == 5 + 250 + 7
    assert alloc[9]["time_us"] == 262
    assert trace[-1]["time_us"] == 1262
    # Frames: the site, then where in the record.
    assert alloc[3]["frames"] == [{"filename": "site", "line": 0, "name": "aten::mm"},
                                  {"filename": "record", "line": 0, "name": "allocation 3, step 0 (forward)"}]
    assert alloc[5]["frames"][0] == {"filename": "libtorch_cuda.so", "line": 0,
                                     "name": "at::native::empty_cuda+0x1f"}
    assert alloc[2]["frames"] == [{"filename": "record", "line": 0, "name": "allocation 2, set-up"}]
    assert alloc[8]["frames"][1]["name"] == "allocation 8, step 1 (optimizer)"


def test_deterministic_and_device_option(record, snap_path, tmp_path):
    again = tmp_path / "again.pickle"
    assert run_tool(record, "-o", again).returncode == 0
    assert again.read_bytes() == snap_path.read_bytes()
    dev2 = tmp_path / "dev2.pickle"
    r = run_tool(record, "-o", dev2, "--device", "2")
    assert r.returncode == 0, r.stderr
    s = ms.load(dev2)
    assert [len(t) > 0 for t in s["device_traces"]] == [False, False, True]
    assert {seg["device"] for seg in s["segments"]} == {2}
    # --min-block: with 4 MiB, the 3 MiB block is small (a chunk of its own, rounded to the granule).
    mb = tmp_path / "mb.pickle"
    assert run_tool(record, "-o", mb, "--min-block", "4MiB").returncode == 0
    s = ms.load(mb)
    assert Counter(x["segment_type"] for x in s["segments"]) == Counter(large=1, small=4)


def evicting_records(path):
    """The small record with spillway's transfers among its records, as a
    record that holds them would give them."""
    meta, recs = st.read(str(path))
    out = []
    for r in recs:
        out.append(r)
        if isinstance(r, st.Step) and r.step == 1:
            out += [ms.Evict(1, "budget"), ms.Evict(7, "budget"), ms.Restore(1, "on-demand")]
        if isinstance(r, st.Alloc) and r.alloc == 6:
            out += [ms.Evict(4, "pressure"), ms.Evict(3, "budget")]   # freed on the host
        if isinstance(r, st.Alloc) and r.alloc == 9:
            out += [ms.Evict(9, "budget")]                   # still on the host at the end
    return meta, out


def test_evictions_and_restores_are_shown(record, tmp_path):
    meta, recs = evicting_records(record)
    snap = ms.convert(meta, recs)
    out = tmp_path / "evict.pickle"
    ms.write(snap, out)
    snap = ms.load(out)
    trace = snap["device_traces"][0]
    marked = [(e["action"], e["frames"][0]["name"]) for e in trace if e["frames"][0]["filename"] == "spillway"]
    assert marked == [
        ("free_requested", "evicted to host (pressure)"), ("free_completed", "evicted to host (pressure)"),  # 4
        ("free_requested", "evicted to host (budget)"), ("free_completed", "evicted to host (budget)"),
        ("segment_free", "evicted to host (budget)"),                                  # 3
        ("free_requested", "evicted to host (budget)"), ("free_completed", "evicted to host (budget)"),
        ("segment_free", "evicted to host (budget)"),                                  # 1: large
        ("free_requested", "evicted to host (budget)"), ("free_completed", "evicted to host (budget)"),  # 7: small
        ("segment_alloc", "restored from host (on-demand)"), ("alloc", "restored from host (on-demand)"),
        ("free_requested", "evicted to host (budget)"), ("free_completed", "evicted to host (budget)"),
        ("segment_free", "evicted to host (budget)"),                                  # 9
    ]
    entries = by_alloc(trace)
    assert len({e["addr"] for e in entries[1]}) == 1           # the address is kept
    # Freed while on the host: nothing more on the device; 4's range is reused by 7.
    assert [e["action"] for e in entries[3]] == ["segment_alloc", "alloc", "free_requested",
                                                 "free_completed", "segment_free"]
    assert entries[7][0]["addr"] == entries[4][0]["addr"]
    c = snap["spillway"]["counts"]
    assert (c["evictions"], c["restores"], c["evicted_at_end"], c["frees_while_evicted"]) == (5, 1, 2, 2)
    assert snap["spillway"]["evictions_in_record"] is True
    assert [(x["alloc"], x["size"]) for x in snap["spillway"]["evicted_at_end"]] == [(7, SIZES[7][0]), (9, SIZES[9][0])]
    active = {b["address"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"}
    for i in (7, 9):
        assert entries[i][0]["addr"] not in active             # on the host: not device memory
    assert next(e for e in entries[1] if e["action"] == "alloc")["addr"] in active
    actions = Counter(e["action"] for e in trace)
    assert actions["alloc"] == 9 + 1 and actions["free_completed"] == 3 - 2 + 5
    # What cannot be: a transfer of a block that is not there.
    with pytest.raises(ms.ConversionError, match="not live"):
        ms.convert(meta, recs + [ms.Evict(3, "budget")])
    with pytest.raises(ms.ConversionError, match="already evicted"):
        ms.convert(meta, recs + [ms.Evict(9, "budget")])
    with pytest.raises(ms.ConversionError, match="not evicted"):
        ms.convert(meta, recs + [ms.Restore(1, "prefetch")])


def test_load_refuses_what_it_did_not_write(snap, tmp_path):
    def refused(s, match, protocol=4):
        p = tmp_path / "bad.pickle"
        p.write_bytes(pickle.dumps(s, protocol=protocol))
        with pytest.raises(ms.SnapshotError, match=match) as e:
            ms.load(p)
        assert str(p) in str(e.value)

    def copy():
        return pickle.loads(pickle.dumps(snap))

    s = copy()                                                  # a free lost
    t = s["device_traces"][0]
    k = next(k for k, e in enumerate(t) if e["action"] == "free_requested")
    del t[k:k + 2]
    refused(s, "segment still holds a live block")
    del t[k]                                                    # and its segment's
    refused(s, "leaves 5 segments live, 'segments' holds 4")
    s = copy()                                                  # an allocation lost
    t = s["device_traces"][0]
    del t[next(k for k, e in enumerate(t) if e["action"] == "alloc")]
    refused(s, "")
    s = copy()                                                  # a block past its segment
    s["segments"][0]["blocks"][0]["size"] += 512
    refused(s, "add up")
    s = copy()
    s["segments"][0]["blocks"][0]["state"] = "evicted"
    refused(s, "state")
    refused(copy(), "protocol 5", protocol=5)                  # the page reads 2 to 4
    refused({"segments": set()}, "EMPTY_SET")                   # not plain data
    p = tmp_path / "cut.pickle"
    p.write_bytes(pickle.dumps(snap, protocol=4)[:-100])
    with pytest.raises(ms.SnapshotError, match="not a pickle"):
        ms.load(p)


def test_the_committed_record(tmp_path):
    out = tmp_path / "gpt.pickle"
    r = run_tool(GPT, "-o", out)
    assert r.returncode == 0, r.stderr
    s = ms.load(out)
    counts = st.check(str(GPT))["counts"]
    actions = Counter(e["action"] for e in s["device_traces"][0])
    assert actions["alloc"] == counts["Alloc"] and actions["free_completed"] == counts["Free"]
    assert sum(b["state"] == "active_allocated" for x in s["segments"] for b in x["blocks"]) \
        == counts["Alloc"] - counts["Free"]
    # The viewer's Active Memory Timeline adds allocs and takes frees: its peak
    # is the record's (454.1 MiB in step 3, harness/records/README.md).
    live, now, peak = {}, 0, 0
    for r in st.iter_records(str(GPT)):
        if isinstance(r, st.Alloc):
            live[r.alloc] = r.size
            now += r.size
            peak = max(peak, now)
        elif isinstance(r, st.Free):
            now -= live.pop(r.alloc)
    shown, shown_peak = 0, 0
    for e in s["device_traces"][0]:
        shown += {"alloc": e["size"], "free_completed": -e["size"]}.get(e["action"], 0)
        shown_peak = max(shown_peak, shown)
    assert shown_peak == peak and f"{peak / MIB:.1f}" == "454.1"
    assert shown == now == sum(x["requested_size"] for x in s["segments"])


# ---------------------------------------------------------------- command line

def test_help():
    r = run_tool("--help")
    assert r.returncode == 0 and "memory_viz" in r.stdout and "--device" in r.stdout


@pytest.mark.parametrize("damage", ["truncated", "bad magic", "flipped byte", "missing"])
def test_a_bad_record_is_named_without_a_traceback(record, tmp_path, damage):
    data = record.read_bytes()
    bad = tmp_path / "bad.spwt"
    if damage == "truncated":
        bad.write_bytes(data[:-20])
    elif damage == "bad magic":
        bad.write_bytes(b"NOTATRACE" + data[9:])
    elif damage == "flipped byte":
        b = bytearray(data)
        b[len(b) // 2] ^= 0x40
        bad.write_bytes(bytes(b))
    out = tmp_path / "out.pickle"
    r = run_tool(bad, "-o", out)
    assert r.returncode == 1, r
    assert r.stderr.startswith(f"to_memory_snapshot.py: {bad}: "), r.stderr
    assert ("cannot read" if damage == "missing" else "not a valid .spwt record: offset") in r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1
    assert not out.exists() and list(tmp_path.glob("out.pickle*")) == []


def test_bad_options(record, tmp_path):
    r = run_tool(record, "-o", tmp_path / "x.pickle", "--min-block", "12 parsecs")
    assert r.returncode == 2 and "--min-block" in r.stderr and "Traceback" not in r.stderr
    r = run_tool(record, "-o", tmp_path / "no" / "such" / "dir.pickle")
    assert r.returncode == 1 and "cannot write" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------- PyTorch's own code

@pytest.fixture(scope="module")
def memory_viz():
    try:
        from torch.cuda import _memory_viz
    except Exception as e:  # no torch, or a torch that does not import here
        pytest.skip(f"torch.cuda._memory_viz not importable: {e}")
    return _memory_viz


def lines(text):
    return text  # format_flamegraph stand-in: the flamegraph's input, no download


@pytest.mark.parametrize("which", ["small", "evicting", "gpt_varlen"])
def test_pytorch_memory_viz_reads_it(memory_viz, record, tmp_path, which, capsys):
    if which == "small":
        s = ms.convert_file(record)
    elif which == "evicting":
        s = ms.convert(*evicting_records(record))
    else:
        s = ms.convert_file(GPT)
    path = tmp_path / f"{which}.pickle"
    ms.write(s, path)
    with open(path, "rb") as f:          # as torch's own tools read it
        data = pickle.load(f)
    mv = memory_viz
    active = sum(b["size"] for x in data["segments"] for b in x["blocks"] if b["state"] == "active_allocated")
    if hasattr(mv, "trace_plot"):        # torch 2: the snapshot dict
        seg = mv.segments(data, format_flamegraph=lines)
        mem = mv.memory(data, format_flamegraph=lines)
        assert "active_allocated" in seg and "inactive" in seg and mem
        if which == "small":
            assert "site:0:aten::mm" in seg
        if hasattr(mv, "segsum"):
            assert f"segments: {len(data['segments'])}" in mv.segsum(data)
        if hasattr(mv, "trace"):
            assert "cudaMalloc" in mv.trace(data)
        for html in (mv.trace_plot(data), mv.trace_plot(data, plot_segments=True), mv.segment_plot(data)):
            assert "add_local_files" in html and "snapshot.pickle" in html
    else:                                # torch 1.13: memory_snapshot(), the segments list
        segs = data["segments"]
        seg = mv.segments(segs, format_flamegraph=lines)
        mem = mv.memory(segs, format_flamegraph=lines)
        assert "active_allocated" in seg and "inactive" in seg and mem
        stats = mv.stats(segs)           # asserts each segment's blocks add up
        assert stats["segments"] == len(segs) and stats["active_allocated"].value == active
        assert stats["total_size"].value == sum(x["total_size"] for x in segs)
    # compare (both versions take segment lists): the set-up's end against the record's.
    meta, recs = st.read(str(record))
    before = ms.convert(meta, recs[:next(k for k, r in enumerate(recs) if isinstance(r, st.Step))])
    out = mv.compare(before["segments"], data["segments"], format_flamegraph=lines)
    assert "only_after" in out and "only_after" in capsys.readouterr().out
