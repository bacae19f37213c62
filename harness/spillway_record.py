"""Writer and reader of the spillway trace format, version 2 (docs/record-format.md).

Pure Python (zlib.crc32 for CRC-32). The API:

    with Writer(path, meta={"source": "recorder"}) as w:
        name = w.string("aten::mm")          # interned: STRING emitted once
        w.alloc(1, 4096, stream=0, site=name)
        w.launch(0, name, 1500, [(1, 0, 4096, WRITE)])
        w.free(1)

    meta, records = read(path)               # raises RecordError(offset, msg)
    for rec in iter_records(path): ...       # streaming form of the same checks

Records are the namedtuples below (String, Alloc, Free, Launch, Copy, Step,
Phase, Duration, and since version 2 Evict and Restore); touches are Touch(alloc, offset, length, mode) and copy
references Ref(alloc, offset).  The reader performs every check listed in the
format's "What a reader checks", plus range checks on the one-byte enums
(touch mode, copy kind, phase); every refusal is a RecordError whose `offset`
is the byte offset in the file of the problem.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections import namedtuple

MAGIC = b"SPWTRACE"
VERSION = 2          # written; read: OLDEST_VERSION .. VERSION
OLDEST_VERSION = 1   # version 1 has no EVICT or RESTORE
BLOCK_TAG = b"BLK1"
END_TAG = b"END1"
MAX_META = 1 << 20
MAX_BLOCK = 1 << 20

T_STRING, T_ALLOC, T_FREE, T_LAUNCH, T_COPY, T_STEP, T_PHASE, T_DURATION = range(1, 9)
T_EVICT, T_RESTORE = 9, 10  # version 2

MODE_UNKNOWN, READ, WRITE, READ_WRITE = 0, 1, 2, 3
COPY_H2D, COPY_D2H, COPY_D2D, COPY_MEMSET = 1, 2, 3, 4
PHASE_OTHER, PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER = 0, 1, 2, 3
# Why spillway moved an allocation (EVICT, RESTORE), by its cause byte.
MOVE_CAUSES = ("budget", "pressure", "prefetch", "on-demand")

String = namedtuple("String", "id text")
Alloc = namedtuple("Alloc", "alloc size stream site")
Free = namedtuple("Free", "alloc stream")
Touch = namedtuple("Touch", "alloc offset length mode")
Launch = namedtuple("Launch", "stream name duration_ns touches")
Ref = namedtuple("Ref", "alloc offset")
Copy = namedtuple("Copy", "stream kind bytes duration_ns dst src")
Step = namedtuple("Step", "step")
Phase = namedtuple("Phase", "phase")
Evict = namedtuple("Evict", "alloc cause")  # cause: an index of MOVE_CAUSES
Restore = namedtuple("Restore", "alloc cause")
Duration = namedtuple("Duration", "launch duration_ns")

_U64_MAX = (1 << 64) - 1


class RecordError(Exception):
    """A refused record: `offset` is the byte offset of the problem in the file."""

    def __init__(self, offset: int, message: str):
        super().__init__(f"offset {offset}: {message}")
        self.offset = offset
        self.message = message


TraceError = RecordError  # its name before session 19, for scripts


# ---------------------------------------------------------------- encoding

def _varint(value: int, out: bytearray) -> None:
    if value < 0 or value > _U64_MAX:
        raise ValueError(f"varint out of range: {value}")
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return


def _u8(value: int, out: bytearray) -> None:
    if not 0 <= value <= 255:
        raise ValueError(f"u8 out of range: {value}")
    out.append(value)


def encode_record(rec) -> bytes:
    """The bytes of one record (type byte and fields)."""
    out = bytearray()
    if isinstance(rec, String):
        data = rec.text.encode("utf-8")
        out.append(T_STRING)
        _varint(rec.id, out)
        _varint(len(data), out)
        out += data
    elif isinstance(rec, Alloc):
        out.append(T_ALLOC)
        for v in rec:
            _varint(v, out)
    elif isinstance(rec, Free):
        out.append(T_FREE)
        for v in rec:
            _varint(v, out)
    elif isinstance(rec, Launch):
        out.append(T_LAUNCH)
        _varint(rec.stream, out)
        _varint(rec.name, out)
        _varint(rec.duration_ns, out)
        _varint(len(rec.touches), out)
        for t in rec.touches:
            alloc, offset, length, mode = t
            _varint(alloc, out)
            _varint(offset, out)
            _varint(length, out)
            _u8(mode, out)
    elif isinstance(rec, Copy):
        out.append(T_COPY)
        _varint(rec.stream, out)
        _u8(rec.kind, out)
        _varint(rec.bytes, out)
        _varint(rec.duration_ns, out)
        for ref in (rec.dst, rec.src):
            _varint(ref[0], out)
            _varint(ref[1], out)
    elif isinstance(rec, Step):
        out.append(T_STEP)
        _varint(rec.step, out)
    elif isinstance(rec, Phase):
        out.append(T_PHASE)
        _u8(rec.phase, out)
    elif isinstance(rec, Duration):
        out.append(T_DURATION)
        _varint(rec.launch, out)
        _varint(rec.duration_ns, out)
    elif isinstance(rec, (Evict, Restore)):
        if not 0 <= rec.cause < len(MOVE_CAUSES):
            raise ValueError(f"move cause {rec.cause} is not 0-3")
        out.append(T_EVICT if isinstance(rec, Evict) else T_RESTORE)
        _varint(rec.alloc, out)
        _u8(rec.cause, out)
    else:
        raise TypeError(f"not a trace record: {rec!r}")
    return bytes(out)


class Writer:
    """Writes a trace incrementally, holding at most one block in memory.

    `path` is a file name or a binary file object (left open on close()).
    The writer does not validate the event stream (the reader does); it
    interns strings: string(text) returns an id, emitting STRING once.
    """

    def __init__(self, path, meta: dict | None = None, block_limit: int = MAX_BLOCK):
        if not 0 < block_limit <= MAX_BLOCK:
            raise ValueError("block_limit must be in 1 .. 1 MiB")
        self._own = not hasattr(path, "write")
        self._f = open(path, "wb") if self._own else path
        self._limit = block_limit
        self._buf = bytearray()
        self._count = 0
        self.records = 0
        self.launches = 0
        self._strings: dict[str, int] = {}
        meta_bytes = json.dumps(meta or {}, sort_keys=True).encode("utf-8")
        if len(meta_bytes) > MAX_META:
            raise ValueError("meta larger than 1 MiB")
        self._f.write(MAGIC + struct.pack("<II", VERSION, len(meta_bytes)) + meta_bytes
                      + struct.pack("<I", zlib.crc32(meta_bytes)))
        self.closed = False

    # -- records
    def write(self, rec) -> None:
        data = encode_record(rec)
        if len(data) > self._limit:
            raise ValueError(f"record of {len(data)} bytes exceeds the block limit")
        if len(self._buf) + len(data) > self._limit:
            self._flush()
        self._buf += data
        self._count += 1
        self.records += 1
        if isinstance(rec, Launch):
            self.launches += 1

    def string(self, text: str) -> int:
        sid = self._strings.get(text)
        if sid is None:
            sid = len(self._strings) + 1
            self._strings[text] = sid
            self.write(String(sid, text))
        return sid

    def alloc(self, alloc: int, size: int, stream: int = 0, site: int = 0) -> None:
        self.write(Alloc(alloc, size, stream, site))

    def free(self, alloc: int, stream: int = 0) -> None:
        self.write(Free(alloc, stream))

    def launch(self, stream: int, name: int, duration_ns: int, touches) -> int:
        """Writes a LAUNCH; returns its index (for duration())."""
        self.write(Launch(stream, name, duration_ns, tuple(Touch(*t) for t in touches)))
        return self.launches - 1

    def copy(self, stream: int, kind: int, nbytes: int, duration_ns: int, dst, src=(0, 0)) -> None:
        self.write(Copy(stream, kind, nbytes, duration_ns, Ref(*dst), Ref(*src)))

    def step(self, step: int) -> None:
        self.write(Step(step))

    def phase(self, phase: int) -> None:
        self.write(Phase(phase))

    def duration(self, launch: int, duration_ns: int) -> None:
        self.write(Duration(launch, duration_ns))

    def evict(self, alloc: int, cause: int = 0) -> None:
        self.write(Evict(alloc, cause))

    def restore(self, alloc: int, cause: int = 3) -> None:
        self.write(Restore(alloc, cause))

    # -- framing
    def _flush(self) -> None:
        if not self._count:
            return
        payload = bytes(self._buf)
        self._f.write(BLOCK_TAG + struct.pack("<III", len(payload), self._count, zlib.crc32(payload))
                      + payload)
        self._buf.clear()
        self._count = 0

    def close(self) -> None:
        if self.closed:
            return
        self._flush()
        rec = struct.pack("<Q", self.records)
        self._f.write(END_TAG + rec + struct.pack("<I", zlib.crc32(rec)))
        self._f.flush()
        if self._own:
            self._f.close()
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        elif self._own:  # leave no valid-looking file behind a failure
            self._f.close()


# ---------------------------------------------------------------- decoding

class _Cursor:
    """Reads fields from one block payload; `base` is the payload's file offset."""

    __slots__ = ("data", "pos", "base")

    def __init__(self, data: bytes, base: int):
        self.data = data
        self.pos = 0
        self.base = base

    def varint(self) -> int:
        start = self.pos
        value = 0
        shift = 0
        data = self.data
        for i in range(10):
            if self.pos >= len(data):
                raise RecordError(self.base + start, "varint runs past the end of its block")
            byte = data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                if value > _U64_MAX:
                    raise RecordError(self.base + start, "varint exceeds 64 bits")
                return value
            shift += 7
        raise RecordError(self.base + start, "varint longer than 10 bytes")

    def u8(self) -> int:
        if self.pos >= len(self.data):
            raise RecordError(self.base + self.pos, "field runs past the end of its block")
        v = self.data[self.pos]
        self.pos += 1
        return v

    def raw(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise RecordError(self.base + self.pos, f"{n} bytes run past the end of its block")
        v = self.data[self.pos:self.pos + n]
        self.pos += n
        return v

    def offset(self) -> int:
        return self.base + self.pos


class _State:
    """The semantic checks: strings, live allocations, launches."""

    def __init__(self, version: int = VERSION):
        self.version = version
        self.strings: set[int] = set()
        self.ever: set[int] = set()
        self.live: dict[int, int] = {}  # alloc -> size
        self.evicted: set[int] = set()  # live allocations EVICTed, not RESTOREd since
        self.launches = 0

    def string_used(self, sid: int, off: int) -> None:
        if sid and sid not in self.strings:
            raise RecordError(off, f"string id {sid} used before it is defined")

    def live_alloc(self, alloc: int, off: int, what: str) -> int:
        size = self.live.get(alloc)
        if size is None:
            raise RecordError(off, f"{what} names allocation {alloc}, which is not live")
        return size


def _read_record(c: _Cursor, st: _State):
    """One record. Malformed fields fail at their first byte; every other
    problem of the record (ids, liveness, ranges, values) at its type byte."""
    at = c.offset()
    rtype = c.u8()
    if rtype == T_STRING:
        sid = c.varint()
        n = c.varint()
        data = c.raw(n)
        if sid == 0:
            raise RecordError(at, "string id 0 defined (0 means none)")
        if sid in st.strings:
            raise RecordError(at, f"string id {sid} defined twice")
        st.strings.add(sid)
        return String(sid, data.decode("utf-8", errors="replace"))
    if rtype == T_ALLOC:
        alloc, size, stream, site = c.varint(), c.varint(), c.varint(), c.varint()
        if alloc == 0:
            raise RecordError(at, "allocation id 0 (0 is reserved)")
        if alloc in st.ever:
            raise RecordError(at, f"ALLOC reuses allocation id {alloc}")
        st.string_used(site, at)
        st.ever.add(alloc)
        st.live[alloc] = size
        return Alloc(alloc, size, stream, site)
    if rtype == T_FREE:
        alloc, stream = c.varint(), c.varint()
        st.live_alloc(alloc, at, "FREE")
        del st.live[alloc]
        st.evicted.discard(alloc)  # an evicted allocation may be freed
        return Free(alloc, stream)
    if rtype == T_LAUNCH:
        stream, name, duration = c.varint(), c.varint(), c.varint()
        n_at = c.offset()
        n = c.varint()
        if n > (len(c.data) - c.pos) // 4:   # a touch takes at least 4 bytes
            raise RecordError(n_at, f"LAUNCH claims {n} touches, more than its block can hold")
        raw = [(c.varint(), c.varint(), c.varint(), c.u8()) for _ in range(n)]
        st.string_used(name, at)
        touches = []
        for alloc, offset, length, mode in raw:
            size = st.live_alloc(alloc, at, "touch")
            if offset + length > size:
                raise RecordError(at, f"touch [{offset}, {offset + length}) outside allocation "
                                     f"{alloc} of {size} bytes")
            if mode > READ_WRITE:
                raise RecordError(at, f"touch mode {mode} unknown")
            touches.append(Touch(alloc, offset, length, mode))
        st.launches += 1
        return Launch(stream, name, duration, tuple(touches))
    if rtype == T_COPY:
        stream = c.varint()
        kind = c.u8()
        nbytes, duration = c.varint(), c.varint()
        dst = Ref(c.varint(), c.varint())
        src = Ref(c.varint(), c.varint())
        if not COPY_H2D <= kind <= COPY_MEMSET:
            raise RecordError(at, f"copy kind {kind} unknown")
        if kind == COPY_MEMSET and src != (0, 0):
            raise RecordError(at, "a memset COPY has a source (it must be written as 0, 0)")
        for ref in (dst, src):
            if ref.alloc:
                size = st.live_alloc(ref.alloc, at, "copy reference")
                if ref.offset + nbytes > size:
                    raise RecordError(at, f"copy range [{ref.offset}, {ref.offset + nbytes}) outside "
                                         f"allocation {ref.alloc} of {size} bytes")
        return Copy(stream, kind, nbytes, duration, dst, src)
    if rtype == T_STEP:
        return Step(c.varint())
    if rtype == T_PHASE:
        phase = c.u8()
        if phase > PHASE_OPTIMIZER:
            raise RecordError(at, f"phase {phase} unknown")
        return Phase(phase)
    if rtype == T_DURATION:
        launch, duration = c.varint(), c.varint()
        if launch >= st.launches:
            raise RecordError(at, f"DURATION names launch {launch}; {st.launches} launches so far")
        return Duration(launch, duration)
    if rtype in (T_EVICT, T_RESTORE):
        if st.version < 2:
            raise RecordError(at, f"record type {rtype} is unknown in version {st.version} "
                                 "(EVICT and RESTORE came in version 2)")
        alloc, cause = c.varint(), c.u8()
        name = "EVICT" if rtype == T_EVICT else "RESTORE"
        if cause >= len(MOVE_CAUSES):
            raise RecordError(at, f"{name} cause {cause} is not 0-3")
        st.live_alloc(alloc, at, name)
        if rtype == T_EVICT:
            if alloc in st.evicted:
                raise RecordError(at, f"EVICT of allocation {alloc}, already evicted")
            st.evicted.add(alloc)
            return Evict(alloc, cause)
        if alloc not in st.evicted:
            raise RecordError(at, f"RESTORE of allocation {alloc}, which is not evicted")
        st.evicted.discard(alloc)
        return Restore(alloc, cause)
    raise RecordError(at, f"unknown record type {rtype}")


def _read_exact(f, n: int, offset: int, what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise RecordError(offset + len(data), f"file ends inside {what} (truncated)")
    return data


def read_header(f) -> dict:
    """Reads and checks the header; returns meta. Leaves f after meta_crc."""
    magic = _read_exact(f, 8, 0, "the magic")
    if magic != MAGIC:
        raise RecordError(0, f"bad magic {magic!r}")
    version, meta_len = struct.unpack("<II", _read_exact(f, 8, 8, "the header"))
    if not OLDEST_VERSION <= version <= VERSION:
        raise RecordError(8, f"version {version} unknown (this reader knows "
                            f"{OLDEST_VERSION} to {VERSION})")
    if meta_len > MAX_META:
        raise RecordError(12, f"meta_len {meta_len} exceeds 1 MiB")
    meta_bytes = _read_exact(f, meta_len, 16, "meta")
    (crc,) = struct.unpack("<I", _read_exact(f, 4, 16 + meta_len, "meta_crc"))
    if crc != zlib.crc32(meta_bytes):
        raise RecordError(16, "meta CRC mismatch")
    try:
        meta = json.loads(meta_bytes.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise RecordError(16, f"meta is not UTF-8 JSON: {e}") from None
    if not isinstance(meta, dict):
        raise RecordError(16, "meta is not a JSON object")
    return meta


def iter_records(path, meta_out: dict | None = None):
    """Yields every record of the trace at `path`, checking as it goes.

    The header's meta is stored into `meta_out` (if given) before the first
    record.  Raises RecordError at the first problem; the generator only ends
    normally after a valid end marker at the end of the file.
    """
    with open(path, "rb") as f:
        meta = read_header(f)
        if meta_out is not None:
            meta_out.update(meta)
        pos = f.tell()
        f.seek(8)  # the version, checked by read_header
        st = _State(struct.unpack("<I", f.read(4))[0])
        f.seek(pos)
        total = 0
        while True:
            tag = f.read(4)
            if len(tag) == 0:
                raise RecordError(pos, "end marker missing (file truncated)")
            if len(tag) < 4:
                raise RecordError(pos + len(tag), "file ends inside a block tag (truncated)")
            if tag == END_TAG:
                rec_bytes = _read_exact(f, 8, pos + 4, "the end marker")
                (crc,) = struct.unpack("<I", _read_exact(f, 4, pos + 12, "the end marker"))
                if crc != zlib.crc32(rec_bytes):
                    raise RecordError(pos, "end marker CRC mismatch")
                (records,) = struct.unpack("<Q", rec_bytes)
                if records != total:
                    raise RecordError(pos + 4, f"end marker counts {records} records, "
                                              f"the blocks hold {total}")
                if f.read(1):
                    raise RecordError(pos + 16, "bytes follow the end marker")
                return
            if tag != BLOCK_TAG:
                raise RecordError(pos, f"bad block tag {tag!r}")
            length, count, crc = struct.unpack("<III", _read_exact(f, 12, pos + 4, "a block header"))
            if not 1 <= length <= MAX_BLOCK:
                raise RecordError(pos + 4, f"block length {length} outside 1 .. 1 MiB")
            if count < 1:
                raise RecordError(pos + 8, "block with 0 records")
            payload = _read_exact(f, length, pos + 16, "a block payload")
            if zlib.crc32(payload) != crc:
                raise RecordError(pos, "block CRC mismatch")
            c = _Cursor(payload, pos + 16)
            for i in range(count):
                if c.pos >= length:
                    raise RecordError(pos + 8, f"block holds {i} records, its header says {count}")
                yield _read_record(c, st)
            if c.pos != length:
                raise RecordError(pos + 8, f"block's {count} records end {length - c.pos} bytes "
                                             f"before its length")
            total += count
            pos += 16 + length


def read(path):
    """Reads and checks a whole trace: returns (meta, [records])."""
    meta: dict = {}
    records = list(iter_records(path, meta))
    return meta, records


def check(path) -> dict:
    """Checks a trace without keeping its records; returns a summary."""
    meta: dict = {}
    counts: dict[str, int] = {}
    for rec in iter_records(path, meta):
        name = type(rec).__name__
        counts[name] = counts.get(name, 0) + 1
    return {"meta": meta, "counts": counts}


def main(argv=None) -> int:
    """Checks each record named on the command line; 1 at the first refused."""
    import sys

    for p in sys.argv[1:] if argv is None else argv:
        try:
            summary = check(p)
        except RecordError as e:
            print(f"{p}: REFUSED: {e}")
            return 1
        print(f"{p}: ok {summary['counts']} meta={summary['meta']}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
