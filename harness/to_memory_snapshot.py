#!/usr/bin/env python3
"""A `.spwt` record as PyTorch's memory snapshot, for PyTorch's memory viewer.

    python3 harness/to_memory_snapshot.py RECORD.spwt -o snapshot.pickle [--device N]

writes what `torch.cuda.memory._snapshot()` returns and `_dump_snapshot()`
pickles: a dict with `segments` (the allocator's state at the end of the
record) and `device_traces` (every allocator event of the record, in order).
https://pytorch.org/memory_viz opens it (drag and drop; nothing is uploaded),
and so do the functions of `torch.cuda._memory_viz` (`trace_plot`,
`segment_plot`, `segments`, `memory`, `segsum`, `trace`). Importable:

    snap = convert_file("run.spwt")          # the dict
    write(snap, "run.pickle")                # pickle protocol 4, atomically
    snap = load("run.pickle")                # reads and validates (SnapshotError)

The schema is PyTorch's (torch/csrc/cuda/memory_snapshot.cpp, 2.x; what
torch 1.13's `memory_snapshot()` holds is its `segments` list):

- segment: `device`, `address`, `total_size`, `allocated_size`,
  `active_size`, `requested_size`, `stream`, `segment_type` ('large' or
  'small'), `segment_pool_id`, `is_expandable`, `frames`, `blocks`;
- block: `address`, `size`, `requested_size`, `state` ('active_allocated' or
  'inactive'), `frames`; a segment's blocks tile it, from its address, in
  order (the viewer computes each block's address that way);
- trace entry: `action` ('segment_alloc', 'alloc', 'free_requested',
  'free_completed', 'segment_free'), `addr`, `size`, `stream`, `time_us`,
  `frames`; a frame is `{'filename', 'line', 'name'}`.

Besides, a `spillway` key (ignored by PyTorch's code and page) says where the
snapshot came from and counts what it holds; `load` checks the trace against
those counts.

What the record gives, and what is laid out here
------------------------------------------------
A record (docs/record-format.md) names allocations by id and size, never by
address; spillway's rounding and caching are not in it either. So addresses
and segments are synthetic, laid out deterministically (the same record and
options give the same bytes) the way spillway holds memory (docs/config.md):

- A block of at least `--min-block` bytes (SPILLWAY_MIN_BLOCK, 1 MiB by
  default) is a *large* block: a segment of its own, its size rounded up to
  the 2 MiB granule. The segment appears at the ALLOC and goes at the FREE
  (spillway may keep a freed block cached for reuse; whether it does depends
  on the budget, not on the record).
- A smaller one is a *small* block: 512-byte multiples carved first-fit from
  2 MiB chunks of its stream (a 'small' segment each), as spillway carves
  them. Chunks are kept to the end (spillway releases wholly free chunks
  only under memory pressure, which the record cannot say).
- Segment addresses count up from 0x7f0000000000, each 2 MiB-aligned, and
  are never reused: a large block's address then names that one allocation
  in the whole snapshot (the viewer keys blocks by address), and stays its
  address while it is evicted, as spillway keeps a block's address for its
  life. A freed small block's range is reused inside its chunk, as an
  allocator does (the viewer numbers each reuse: `b7f0000000200_1`). Every
  address and size stays below 2**53, which the page's JavaScript holds
  exactly.
- `size` in trace entries and `requested_size` in blocks are the sizes the
  program asked for (the record's); a block's `size` is the rounded one, so
  the viewer shows the rounding as free space lost.
- `stream` is the record's stream number (0 the default stream).
- `frames` (innermost first): the allocation site the record names (an
  operator such as `aten::mm`, shown as `site:0:aten::mm`; a native site
  `module!symbol+0x1f` as `module:0:symbol+0x1f`), then where the record was:
  `record:0:allocation 17, step 3 (backward)`. The allocation id is the
  record's, to find the block again in other tools.
- `time_us`: the record has no clock, only device times of its launches and
  copies (DURATION records included); `time_us` is their running sum before
  the event, a serial model from the record's start, not wall time.

Evictions and restores
----------------------
A version-2 record written by the shim (`SPILLWAY_RECORD`) holds spillway's
evictions and restores in the recorded run: EVICT and RESTORE records, each
naming an allocation and why it moved (docs/record-format.md). A version-1
record, and the CPU recorder's, hold none: a snapshot converted from one
shows none, and says so (`spillway.evictions_in_record` is False).

How they are shown: `convert` takes, among the records, `Evict(alloc, cause)`
and `Restore(alloc, cause)` (spillway_record's, whose cause is an index of
`MOVE_CAUSES`, or any record type of those names with an `alloc` field and a
cause in words). An eviction takes the block's device memory away, so it is written
as the block's `free_requested` + `free_completed` followed, for a large
block, by its segment's `segment_free`; a restore as `segment_alloc` +
`alloc` at the same address. Each carries a first frame
`spillway:0:evicted to host (budget)` or
`spillway:0:restored from host (on-demand)`. In the page, the *Active Memory
Timeline* then drops at an eviction and a new band appears at the restore
(its frames say "restored from host"); *Allocator State History* lists the
events with those frames and shows the segment gone while the block is on
the host. These are the actions PyTorch writes itself: every viewer and
`_memory_viz` function handles them. A block evicted at the end of the
record is not in `segments` (it holds no device memory) and is listed in
`spillway.evicted_at_end`.
"""

from __future__ import annotations

import argparse
import bisect
import os
import pickle
import pickletools
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import spillway_record as st  # noqa: E402

Evict = st.Evict
Restore = st.Restore

BASE_ADDRESS = 0x7F0000000000
GRANULE = 2 << 20
CHUNK = 2 << 20
SMALL_ALIGN = 512
DEFAULT_MIN_BLOCK = 1 << 20
JS_MAX_INT = 1 << 53           # the page's JavaScript numbers are exact below this
PICKLE_PROTOCOL = 4            # the page's unpickler reads protocols 2 to 4
FORMAT = 1                     # of the `spillway` key

MEMORY_VIZ_URL = "https://pytorch.org/memory_viz"
PHASES = {st.PHASE_OTHER: "other", st.PHASE_FORWARD: "forward",
          st.PHASE_BACKWARD: "backward", st.PHASE_OPTIMIZER: "optimizer"}
TRACE_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free")
# What PyTorch writes; a snapshot not from this converter may hold any of them.
TORCH_ACTIONS = TRACE_ACTIONS + ("segment_map", "segment_unmap", "snapshot", "oom")
BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")
# The opcodes the memory_viz page's unpickler (torch/utils/viz/MemoryViz.js)
# knows. None of them builds an object or calls anything, so checking a file
# against this list before unpickling also makes `load` safe on any file.
PAGE_OPCODES = frozenset((
    "PROTO", "FRAME", "STOP", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET",
    "LONG_BINGET", "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_LIST", "LIST",
    "APPEND", "APPENDS", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE",
    "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT",
    "SHORT_BINUNICODE", "BINUNICODE",
))


class ConversionError(Exception):
    """Records that cannot be converted (an eviction of a block not resident...)."""


class SnapshotError(Exception):
    """A snapshot `load` refuses."""


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def parse_size(text: str) -> int:
    """`1MiB`, `512KiB`, `4096` (bytes); K/M/G and KB/MB/GB are binary too."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"'{text}' is not a size such as 1MiB or 4096")
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()])


# ---------------------------------------------------------------- conversion

class _Chunk:
    """A small-block chunk: its free ranges, sorted, as [offset, length]."""

    def __init__(self, addr: int, size: int, stream: int, frames: list):
        self.addr, self.size, self.stream, self.frames = addr, size, stream, frames
        self.free = [[0, size]]

    def carve(self, n: int):
        for i, (off, length) in enumerate(self.free):
            if length >= n:
                if length == n:
                    del self.free[i]
                else:
                    self.free[i] = [off + n, length - n]
                return self.addr + off
        return None

    def give_back(self, addr: int, n: int) -> None:
        off = addr - self.addr
        i = bisect.bisect_left(self.free, [off, 0])
        self.free.insert(i, [off, n])
        # merge with the next, then with the previous
        if i + 1 < len(self.free) and off + n == self.free[i + 1][0]:
            self.free[i][1] += self.free.pop(i + 1)[1]
        if i > 0 and self.free[i - 1][0] + self.free[i - 1][1] == off:
            self.free[i - 1][1] += self.free.pop(i)[1]


class _Block:
    __slots__ = ("id", "size", "stream", "addr", "block_size", "chunk", "frames", "resident")

    def __init__(self, id, size, stream, addr, block_size, chunk, frames):
        self.id, self.size, self.stream, self.addr = id, size, stream, addr
        self.block_size, self.chunk, self.frames = block_size, chunk, frames
        self.resident = True


def _site_frame(text: str) -> dict:
    module, bang, symbol = text.partition("!")
    if bang and module and symbol:
        return {"filename": module, "line": 0, "name": symbol}
    return {"filename": "site", "line": 0, "name": text}


def _launch_durations(records) -> list:
    """The device time of each LAUNCH, by index, DURATION records applied."""
    durations = []
    for rec in records:
        if isinstance(rec, st.Launch):
            durations.append(rec.duration_ns)
        elif isinstance(rec, st.Duration):
            durations[rec.launch] = rec.duration_ns
    return durations


def _kind(rec) -> str:
    name = type(rec).__name__
    return name if name in ("Evict", "Restore") else ""


def convert(meta: dict, records, device: int = 0, min_block: int = DEFAULT_MIN_BLOCK,
            record_name: str = "") -> dict:
    """The snapshot of `records` (a sequence, read twice: spillway_record's
    records, plus Evict/Restore ones) as allocations of GPU `device`."""
    if not 0 <= device < 1024:
        raise ValueError("device must be from 0 to 1023")
    if min_block <= 0:
        raise ValueError("min_block must be positive")
    durations = _launch_durations(records)
    strings: dict[int, str] = {}
    live: dict[int, _Block] = {}
    chunks: dict[int, list] = {}          # stream -> its chunks, in order
    large_segments: dict[int, _Block] = {}  # address -> its (resident) large block
    trace: list = []
    next_addr = BASE_ADDRESS
    t_ns = 0
    launch_index = 0
    step = None
    phase = None
    counts = dict(allocs=0, frees=0, frees_while_evicted=0, evictions=0, restores=0,
                  launches=0, copies=0, steps=0, large_allocs=0, small_allocs=0, chunks=0)

    def entry(action, addr, size, stream, frames):
        trace.append({"action": action, "addr": addr, "size": size, "stream": stream,
                      "time_us": t_ns // 1000, "frames": frames})

    def take(size):
        nonlocal next_addr
        addr = next_addr
        next_addr += _round_up(size, GRANULE)
        if next_addr >= JS_MAX_INT:
            raise ConversionError("the record's allocations add up to more than the "
                                  "2**53 bytes of address space the viewer can show")
        return addr

    def transfer_frames(b, what, cause):
        if isinstance(cause, int):
            cause = st.MOVE_CAUSES[cause] if 0 <= cause < len(st.MOVE_CAUSES) else str(cause)
        text = f"{what} ({cause})" if cause else what
        return [{"filename": "spillway", "line": 0, "name": text}] + b.frames

    for rec in records:
        kind = _kind(rec)
        if isinstance(rec, st.String):
            strings[rec.id] = rec.text
        elif isinstance(rec, st.Alloc):
            where = f"allocation {rec.alloc}, " + (
                "set-up" if step is None else f"step {step}"
                + (f" ({PHASES.get(phase, phase)})" if phase is not None else ""))
            frames = ([_site_frame(strings[rec.site])] if rec.site else []) + \
                [{"filename": "record", "line": 0, "name": where}]
            if rec.size >= min_block:
                block_size = _round_up(max(rec.size, 1), GRANULE)
                addr = take(block_size)
                b = _Block(rec.alloc, rec.size, rec.stream, addr, block_size, None, frames)
                large_segments[addr] = b
                entry("segment_alloc", addr, block_size, rec.stream, frames)
                counts["large_allocs"] += 1
            else:
                block_size = _round_up(max(rec.size, 1), SMALL_ALIGN)
                addr = None
                for c in chunks.get(rec.stream, ()):
                    addr = c.carve(block_size)
                    if addr is not None:
                        break
                if addr is None:
                    csize = max(CHUNK, _round_up(block_size, GRANULE))
                    c = _Chunk(take(csize), csize, rec.stream, frames)
                    chunks.setdefault(rec.stream, []).append(c)
                    entry("segment_alloc", c.addr, csize, rec.stream, frames)
                    counts["chunks"] += 1
                    addr = c.carve(block_size)
                b = _Block(rec.alloc, rec.size, rec.stream, addr, block_size, c, frames)
                counts["small_allocs"] += 1
            live[rec.alloc] = b
            entry("alloc", addr, rec.size, rec.stream, frames)
            counts["allocs"] += 1
        elif isinstance(rec, st.Free):
            b = live.pop(rec.alloc)
            counts["frees"] += 1
            if b.resident:
                entry("free_requested", b.addr, b.size, b.stream, b.frames)
                entry("free_completed", b.addr, b.size, b.stream, b.frames)
                if b.chunk is None:
                    del large_segments[b.addr]
                    entry("segment_free", b.addr, b.block_size, b.stream, b.frames)
            else:
                counts["frees_while_evicted"] += 1
            if b.chunk is not None:
                b.chunk.give_back(b.addr, b.block_size)
        elif kind == "Evict":
            b = live.get(rec.alloc)
            if b is None or not b.resident:
                raise ConversionError(f"eviction of allocation {rec.alloc}, which is "
                                      + ("not live" if b is None else "already evicted"))
            frames = transfer_frames(b, "evicted to host", getattr(rec, "cause", ""))
            entry("free_requested", b.addr, b.size, b.stream, frames)
            entry("free_completed", b.addr, b.size, b.stream, frames)
            if b.chunk is None:   # its device memory goes; its address stays
                del large_segments[b.addr]
                entry("segment_free", b.addr, b.block_size, b.stream, frames)
            b.resident = False
            counts["evictions"] += 1
        elif kind == "Restore":
            b = live.get(rec.alloc)
            if b is None or b.resident:
                raise ConversionError(f"restore of allocation {rec.alloc}, which is "
                                      + ("not live" if b is None else "not evicted"))
            frames = transfer_frames(b, "restored from host", getattr(rec, "cause", ""))
            if b.chunk is None:
                large_segments[b.addr] = b
                entry("segment_alloc", b.addr, b.block_size, b.stream, frames)
            entry("alloc", b.addr, b.size, b.stream, frames)
            b.resident = True
            counts["restores"] += 1
        elif isinstance(rec, st.Launch):
            t_ns += durations[launch_index]
            launch_index += 1
            counts["launches"] += 1
        elif isinstance(rec, st.Copy):
            t_ns += rec.duration_ns
            counts["copies"] += 1
        elif isinstance(rec, st.Step):
            step, phase = rec.step, None
            counts["steps"] += 1
        elif isinstance(rec, st.Phase):
            phase = rec.phase

    # The state at the end: resident large blocks, and every chunk.
    segments = []
    for addr, b in large_segments.items():
        blocks = [{"address": addr, "size": b.block_size, "requested_size": b.size,
                   "state": "active_allocated", "frames": b.frames}]
        segments.append(_segment(device, addr, b.block_size, b.stream, "large", b.frames, blocks))
    in_chunk: dict[int, list] = {}
    for b in live.values():
        if b.chunk is not None and b.resident:
            in_chunk.setdefault(b.chunk.addr, []).append(b)
    for stream_chunks in chunks.values():
        for c in stream_chunks:
            blocks = []
            at = c.addr
            for b in sorted(in_chunk.get(c.addr, ()), key=lambda x: x.addr):
                if b.addr > at:
                    blocks.append(_inactive(at, b.addr - at))
                blocks.append({"address": b.addr, "size": b.block_size, "requested_size": b.size,
                               "state": "active_allocated", "frames": b.frames})
                at = b.addr + b.block_size
            if at < c.addr + c.size:
                blocks.append(_inactive(at, c.addr + c.size - at))
            segments.append(_segment(device, c.addr, c.size, c.stream, "small", c.frames, blocks))
    segments.sort(key=lambda s: s["address"])

    evicted = sorted((b for b in live.values() if not b.resident), key=lambda b: b.addr)
    counts["live_at_end"] = len(live)
    counts["evicted_at_end"] = len(evicted)
    device_traces = [[] for _ in range(device + 1)]
    device_traces[device] = trace
    return {
        "segments": segments,
        "device_traces": device_traces,
        "spillway": {
            "format": FORMAT,
            "converter": "harness/to_memory_snapshot.py",
            "record": record_name,
            "record_meta": meta,
            "device": device,
            "layout": {"base_address": BASE_ADDRESS, "granule": GRANULE, "chunk": CHUNK,
                       "small_align": SMALL_ALIGN, "min_block": min_block},
            "time_us": "serial: the running sum of the record's launch and copy device times",
            "evictions_in_record": counts["evictions"] + counts["restores"] > 0,
            "counts": counts,
            "evicted_at_end": [{"address": b.addr, "size": b.size, "alloc": b.id} for b in evicted],
        },
    }


def _inactive(addr: int, size: int) -> dict:
    return {"address": addr, "size": size, "requested_size": 0, "state": "inactive", "frames": []}


def _segment(device, addr, size, stream, seg_type, frames, blocks) -> dict:
    active = [b for b in blocks if b["state"] == "active_allocated"]
    allocated = sum(b["size"] for b in active)
    return {"device": device, "address": addr, "total_size": size,
            "allocated_size": allocated, "active_size": allocated,
            "requested_size": sum(b["requested_size"] for b in active),
            "stream": stream, "segment_type": seg_type, "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": frames, "blocks": blocks}


def convert_file(path, device: int | None = None, min_block: int = DEFAULT_MIN_BLOCK) -> dict:
    """Reads the record at `path` (spillway_record.RecordError if it is refused)
    and converts it; `device` defaults to the record's meta `device` when that
    is a GPU index, else 0."""
    meta, records = st.read(str(path))
    if device is None:
        d = meta.get("device")
        device = d if isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1024 else 0
    return convert(meta, records, device=device, min_block=min_block, record_name=Path(path).name)


def write(snapshot: dict, path) -> None:
    """Pickles `snapshot` (protocol 4, which the page reads) into `path`,
    through a temporary file in the same folder: no half-written file."""
    path = Path(path)
    data = pickle.dumps(snapshot, protocol=PICKLE_PROTOCOL)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)   # as open() would have made it, not mkstemp's 0600
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# ---------------------------------------------------------------- reading back

def load(path) -> dict:
    """Reads a snapshot and validates it (`validate`); SnapshotError naming
    the file if it is refused. Never runs code from the file: its pickle
    opcodes are checked to be plain data (the page's set) first."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise SnapshotError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        loads_checked(data)
        snapshot = pickle.loads(data)
        validate(snapshot)
    except SnapshotError as e:
        raise SnapshotError(f"{path}: {e}") from None
    return snapshot


def loads_checked(data: bytes) -> None:
    """Refuses a pickle the memory_viz page cannot read, or one that is not plain data."""
    try:
        for op, arg, pos in pickletools.genops(data):
            if op.name not in PAGE_OPCODES:
                raise SnapshotError(f"pickle opcode {op.name} at byte {pos}: not one the "
                                    "memory_viz page reads (plain data, protocol 2 to 4)")
            if op.name == "PROTO" and not 2 <= arg <= 4:
                raise SnapshotError(f"pickle protocol {arg}: the memory_viz page reads 2 to 4")
    except SnapshotError:
        raise
    except Exception as e:  # pickletools raises ValueError and friends on damage
        raise SnapshotError(f"not a pickle (damaged or cut short): {e}") from None


def _slot(starts, size_of, addr, size):
    """Where [addr, addr + size) goes among the sorted disjoint intervals
    (`starts`, `size_of`), or None if it overlaps one."""
    i = bisect.bisect_left(starts, addr)
    if addr in size_of or (i > 0 and starts[i - 1] + size_of[starts[i - 1]] > addr):
        return None
    if i < len(starts) and addr + size > starts[i]:
        return None
    return i


def _need(cond, message):
    if not cond:
        raise SnapshotError(message)


def _int(d, key, where, minimum=0):
    v = d.get(key) if isinstance(d, dict) else None
    _need(isinstance(v, int) and not isinstance(v, bool), f"{where}: '{key}' missing or not an integer")
    _need(minimum <= v < JS_MAX_INT, f"{where}: '{key}' = {v} outside [{minimum}, 2**53)")
    return v


def _frames(v, where):
    _need(isinstance(v, list), f"{where}: 'frames' missing or not a list")
    for f in v:
        _need(isinstance(f, dict) and isinstance(f.get("filename"), str)
              and isinstance(f.get("name"), str) and isinstance(f.get("line"), int),
              f"{where}: a frame is not {{'filename': str, 'line': int, 'name': str}}")


def validate(snap) -> None:
    """Checks what the viewer relies on: keys and types; each segment's blocks
    tile it (from its address, in order, sizes adding up to `total_size`);
    its size counters add up; segments do not overlap. For a snapshot of this
    converter (it has the `spillway` key) also: replayed from an empty
    allocator, the trace is consistent (an alloc inside a live segment, over
    no live block; a free of a live block of that size, free_requested then
    free_completed; a segment freed empty) and ends in exactly `segments`;
    and it holds as many allocs, frees, evictions and restores as counted."""
    _need(isinstance(snap, dict), "the snapshot is not a dict")
    segs, traces = snap.get("segments"), snap.get("device_traces")
    _need(isinstance(segs, list), "'segments' missing or not a list")
    _need(isinstance(traces, list) and all(isinstance(t, list) for t in traces),
          "'device_traces' missing or not a list of lists")
    ours = isinstance(snap.get("spillway"), dict)
    spans = []
    for i, s in enumerate(segs):
        where = f"segment {i}"
        _need(isinstance(s, dict), f"{where} is not a dict")
        dev = _int(s, "device", where)
        _need(dev < len(traces) or not traces, f"{where}: device {dev} has no trace list")
        addr = _int(s, "address", where)
        total = _int(s, "total_size", where, minimum=1)
        _int(s, "stream", where, minimum=-(1 << 63))
        _need(s.get("segment_type") in ("large", "small"), f"{where}: segment_type not 'large' or 'small'")
        blocks = s.get("blocks")
        _need(isinstance(blocks, list) and blocks, f"{where}: 'blocks' missing or empty")
        at, allocated, active, requested = addr, 0, 0, 0
        for j, b in enumerate(blocks):
            bw = f"{where} block {j}"
            _need(isinstance(b, dict), f"{bw} is not a dict")
            size = _int(b, "size", bw, minimum=1)
            req = _int(b, "requested_size", bw)
            state = b.get("state")
            _need(state in BLOCK_STATES, f"{bw}: state {state!r} unknown")
            if "address" in b:
                _need(b["address"] == at, f"{bw}: at {b['address']:#x}, where the blocks before it end "
                                          f"at {at:#x} (blocks must tile their segment in order)")
            _frames(b.get("frames"), bw)
            if state != "inactive":
                _need(req <= size, f"{bw}: requested_size {req} above its size {size}")
                active += size
                if state == "active_allocated":
                    allocated += size
                    requested += req
            at += size
        _need(at == addr + total, f"{where}: its blocks add up to {at - addr} bytes, "
                                  f"its total_size is {total}")
        for key, want in (("allocated_size", allocated), ("active_size", active),
                          ("requested_size", requested)):
            if key in s or ours:
                _need(s.get(key) == want, f"{where}: {key} {s.get(key)} but its blocks add up to {want}")
        if "frames" in s or ours:
            _frames(s.get("frames"), where)
        spans.append((dev, addr, total, i))
    spans.sort()
    for (d1, a1, t1, i1), (d2, a2, _, i2) in zip(spans, spans[1:]):
        _need(d1 != d2 or a1 + t1 <= a2, f"segments {i1} and {i2} overlap")

    for d, trace in enumerate(traces):
        last_t = None
        for k, e in enumerate(trace):
            where = f"device {d} trace entry {k}"
            _need(isinstance(e, dict), f"{where} is not a dict")
            action = e.get("action")
            _need(action in (TRACE_ACTIONS if ours else TORCH_ACTIONS), f"{where}: action {action!r} unknown")
            if action != "oom":
                _int(e, "addr", where)
            _int(e, "size", where)
            _int(e, "stream", where, minimum=-(1 << 63))
            if "frames" in e or ours:
                _frames(e.get("frames"), where)
            if "time_us" in e or ours:
                t = _int(e, "time_us", where)
                _need(last_t is None or t >= last_t, f"{where}: time_us {t} goes back (before: {last_t})")
                last_t = t
    if ours:
        _replay(snap)


def _replay(snap) -> None:
    meta = snap["spillway"]
    counts = meta.get("counts")
    _need(isinstance(counts, dict), "spillway: 'counts' missing")
    evicted_end = meta.get("evicted_at_end", [])
    _need(isinstance(evicted_end, list), "spillway: 'evicted_at_end' not a list")
    seen = dict.fromkeys(TRACE_ACTIONS, 0)
    evict_frees = restore_allocs = 0
    for d, trace in enumerate(snap["device_traces"]):
        seg_starts: list = []          # sorted
        seg_size: dict = {}
        blk_starts: list = []          # sorted
        blk_size: dict = {}
        pending = None
        for k, e in enumerate(trace):
            where = f"device {d} trace entry {k} ({e['action']} at {e['addr']:#x})"
            action, addr, size = e["action"], e["addr"], e["size"]
            seen[action] += 1
            note = e["frames"][0]["name"] if e["frames"] else ""
            if pending is not None:
                _need(action == "free_completed" and addr == pending[0] and size == pending[1],
                      f"{where}: a free_requested is not followed by its free_completed")
            if action == "segment_alloc":
                i = _slot(seg_starts, seg_size, addr, size)
                _need(i is not None, f"{where}: overlaps a live segment")
                seg_starts.insert(i, addr)
                seg_size[addr] = size
            elif action == "segment_free":
                _need(seg_size.get(addr) == size, f"{where}: no live segment of {size} bytes there")
                j = bisect.bisect_left(blk_starts, addr)
                _need(j == len(blk_starts) or blk_starts[j] >= addr + size,
                      f"{where}: the segment still holds a live block")
                seg_starts.remove(addr)
                del seg_size[addr]
            elif action == "alloc":
                i = bisect.bisect_right(seg_starts, addr) - 1
                _need(i >= 0 and addr + size <= seg_starts[i] + seg_size[seg_starts[i]],
                      f"{where}: not inside a live segment")
                j = _slot(blk_starts, blk_size, addr, size)
                _need(j is not None, f"{where}: overlaps a live block")
                blk_starts.insert(j, addr)
                blk_size[addr] = size
                restore_allocs += note.startswith("restored from host")
            elif action == "free_requested":
                _need(blk_size.get(addr) == size, f"{where}: no live block of {size} bytes there")
                pending = (addr, size)
                evict_frees += note.startswith("evicted to host")
                continue
            elif action == "free_completed":
                _need(pending is not None, f"{where}: not after its free_requested")
                blk_starts.remove(addr)
                del blk_size[addr]
            pending = None
        _need(pending is None, f"device {d}: the trace ends between a free_requested and its free_completed")
        end_segs = {(s["address"], s["total_size"]) for s in snap["segments"] if s["device"] == d}
        _need(end_segs == set(seg_size.items()),
              f"device {d}: the trace leaves {len(seg_size)} segments live, 'segments' holds "
              f"{len(end_segs)} (or not the same ones)")
        end_blks = {(b["address"], b["requested_size"]) for s in snap["segments"] if s["device"] == d
                    for b in s["blocks"] if b["state"] == "active_allocated"}
        _need(end_blks == set(blk_size.items()),
              f"device {d}: the trace leaves {len(blk_size)} blocks live, 'segments' holds "
              f"{len(end_blks)} allocated (or not the same ones)")
    want = {
        "alloc": counts.get("allocs", -1) + counts.get("restores", -1),
        "free_completed": counts.get("frees", -1) - counts.get("frees_while_evicted", -1)
        + counts.get("evictions", -1),
    }
    for action, n in want.items():
        _need(seen[action] == n, f"the trace holds {seen[action]} '{action}' entries; "
                                 f"the record's counts make {n}")
    _need(restore_allocs == counts.get("restores") and evict_frees == counts.get("evictions"),
          f"the trace marks {evict_frees} evictions and {restore_allocs} restores; "
          f"counted: {counts.get('evictions')} and {counts.get('restores')}")
    _need(counts.get("evicted_at_end") == len(evicted_end), "spillway: evicted_at_end miscounted")


# ---------------------------------------------------------------- command line

def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="to_memory_snapshot.py",
        description="Converts a spillway record (.spwt, SPILLWAY_RECORD or harness/record.py) "
                    "into PyTorch's memory snapshot (what torch.cuda.memory._snapshot() pickles), "
                    f"which {MEMORY_VIZ_URL} and torch.cuda._memory_viz open. Addresses are "
                    "synthetic (a record has none); see docs/profiling.md, \"PyTorch's memory viewer\".",
        epilog="A .spwt record does not hold spillway's evictions and restores, so the snapshot "
               "shows none (the SPILLWAY_TRACE Chrome trace has them).")
    p.add_argument("record", help="the .spwt record")
    p.add_argument("-o", "--output", required=True, help="the snapshot to write (a pickle, e.g. snapshot.pickle)")
    p.add_argument("--device", type=int, default=None,
                   help="the GPU index to put the allocations on (default: the record's meta "
                        "'device' if it is an index, else 0)")
    p.add_argument("--min-block", default=None, metavar="SIZE",
                   help="SPILLWAY_MIN_BLOCK of the run: requests below it are small blocks, carved "
                        "from 2 MiB chunks; the others get a segment each (default 1MiB)")
    args = p.parse_args(argv)
    prog = "to_memory_snapshot.py"
    if args.device is not None and not 0 <= args.device < 1024:
        p.error("--device must be from 0 to 1023")
    min_block = DEFAULT_MIN_BLOCK
    if args.min_block is not None:
        try:
            min_block = parse_size(args.min_block)
        except ValueError as e:
            p.error(f"--min-block: {e}")
        if not 4 << 10 <= min_block <= 1 << 30:
            p.error("--min-block must be from 4KiB to 1GiB")
    try:
        snap = convert_file(args.record, device=args.device, min_block=min_block)
    except st.RecordError as e:
        print(f"{prog}: {args.record}: not a valid .spwt record: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{prog}: {args.record}: cannot read: {e.strerror or e}", file=sys.stderr)
        return 1
    except ConversionError as e:
        print(f"{prog}: {args.record}: {e}", file=sys.stderr)
        return 1
    try:
        write(snap, args.output)
    except OSError as e:
        print(f"{prog}: {args.output}: cannot write: {e.strerror or e}", file=sys.stderr)
        return 1
    c = snap["spillway"]["counts"]
    dev = snap["spillway"]["device"]
    reserved = sum(s["total_size"] for s in snap["segments"])
    allocated = sum(s["requested_size"] for s in snap["segments"])
    if snap["spillway"]["evictions_in_record"]:
        moves = f"{c['evictions']} evictions and {c['restores']} restores marked"
    else:
        moves = ("no evictions or restores in the record (spillway moved nothing, or the "
                 "record is of version 1 or from the CPU recorder)")
    print(f"{args.output}: GPU {dev}: {c['allocs']} allocations and {c['frees']} frees over "
          f"{c['steps']} steps ({len(snap['device_traces'][dev])} trace entries); at the end "
          f"{c['live_at_end']} live, {format_bytes(allocated)} in {len(snap['segments'])} segments "
          f"of {format_bytes(reserved)}; {moves}. Open it at {MEMORY_VIZ_URL}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
