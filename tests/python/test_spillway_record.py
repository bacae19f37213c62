"""The Python writer and reader of docs/record-format.md."""
import struct
import zlib

import pytest

import spillway_record as st


def sample(w):
    mm = w.string("aten::mm")
    site = w.string("site ü")
    w.alloc(1, 4096, 0, site)
    w.alloc(2, 100, 1, 0)
    w.step(0)
    w.phase(st.PHASE_FORWARD)
    w.launch(0, mm, 0, [(1, 0, 4096, st.WRITE), (2, 10, 90, st.READ)])
    w.copy(1, st.COPY_H2D, 64, 1000, (2, 0), (0, 0))
    w.copy(0, st.COPY_MEMSET, 64, 10, (1, 128), (0, 0))
    w.duration(0, 123456789012)
    w.phase(st.PHASE_BACKWARD)
    w.launch(1, 0, 5, [(2, 0, 100, st.READ_WRITE), (1, 4000, 96, st.MODE_UNKNOWN)])
    w.evict(2, 0)
    w.restore(2, 2)
    w.evict(1, 1)
    w.free(2, 1)
    w.step(1)
    w.free(1)  # freed while evicted


EXPECTED = [
    st.String(1, "aten::mm"), st.String(2, "site ü"),
    st.Alloc(1, 4096, 0, 2), st.Alloc(2, 100, 1, 0),
    st.Step(0), st.Phase(1),
    st.Launch(0, 1, 0, (st.Touch(1, 0, 4096, 2), st.Touch(2, 10, 90, 1))),
    st.Copy(1, 1, 64, 1000, st.Ref(2, 0), st.Ref(0, 0)),
    st.Copy(0, 4, 64, 10, st.Ref(1, 128), st.Ref(0, 0)),
    st.Duration(0, 123456789012), st.Phase(2),
    st.Launch(1, 0, 5, (st.Touch(2, 0, 100, 3), st.Touch(1, 4000, 96, 0))),
    st.Evict(2, 0), st.Restore(2, 2), st.Evict(1, 1),
    st.Free(2, 1), st.Step(1), st.Free(1, 0),
]


def write(path, fn=sample, meta=None, **kw):
    with st.Writer(path, meta if meta is not None else {"source": "test", "steps": 2}, **kw) as w:
        fn(w)
    return path.read_bytes()


@pytest.mark.parametrize("limit", [st.MAX_BLOCK, 40, 1])
def test_round_trip(tmp_path, limit):
    p = tmp_path / "t.spwt"
    if limit == 1:
        with pytest.raises(ValueError):
            write(p, block_limit=limit)
        return
    write(p, block_limit=limit)
    meta, recs = st.read(p)
    assert meta == {"source": "test", "steps": 2}
    assert recs == EXPECTED
    nblocks = p.read_bytes().count(b"BLK1")
    assert (nblocks == 1) == (limit == st.MAX_BLOCK)


def test_layout_bytes(tmp_path):
    p = tmp_path / "t.spwt"
    data = write(p, lambda w: w.step(300), meta={})
    meta = b"{}"
    payload = bytes([6, 0xAC, 0x02])
    expect = (b"SPWTRACE" + struct.pack("<II", st.VERSION, 2) + meta + struct.pack("<I", zlib.crc32(meta))
              + b"BLK1" + struct.pack("<III", 3, 1, zlib.crc32(payload)) + payload
              + b"END1" + struct.pack("<Q", 1) + struct.pack("<I", zlib.crc32(struct.pack("<Q", 1))))
    assert data == expect


def test_empty_trace(tmp_path):
    p = tmp_path / "t.spwt"
    write(p, lambda w: None)
    assert st.read(p) == ({"source": "test", "steps": 2}, [])


def test_large_values_and_many_blocks(tmp_path):
    p = tmp_path / "t.spwt"
    big = (1 << 64) - 1

    def fn(w):
        name = w.string("k" * 1000)
        for i in range(1, 3001):
            w.alloc(i, big, 0, name)
            w.launch(0, name, big, [(i, big - 1, 1, st.WRITE)])
    write(p, fn)
    meta, recs = st.read(p)
    assert len(recs) == 6001
    assert recs[-1] == st.Launch(0, 1, big, (st.Touch(3000, big - 1, 1, 2),))
    assert p.read_bytes().count(b"BLK1") >= 1


def refused(path, data):
    path.write_bytes(data)
    with pytest.raises(st.RecordError) as e:
        st.read(path)
    return e.value


def test_every_truncation_refused(tmp_path):
    good = write(tmp_path / "good.spwt")
    bad = tmp_path / "bad.spwt"
    for cut in range(len(good)):
        e = refused(bad, good[:cut])
        assert 0 <= e.offset <= cut, (cut, e)
    # cut exactly at a block boundary: the end marker is missing
    end = good.rindex(b"END1")
    e = refused(bad, good[:end])
    assert e.offset == end and "end marker missing" in str(e)


def test_every_byte_flip_refused(tmp_path):
    good = write(tmp_path / "good.spwt", block_limit=60)
    bad = tmp_path / "bad.spwt"
    for i in range(len(good)):
        data = bytearray(good)
        data[i] ^= 0x41
        refused(bad, bytes(data))


def test_crc_offsets(tmp_path):
    good = write(tmp_path / "good.spwt")
    bad = tmp_path / "bad.spwt"
    meta_len = struct.unpack_from("<I", good, 12)[0]
    blk = 16 + meta_len + 4
    assert good[blk:blk + 4] == b"BLK1"
    # payload byte flipped: the block's offset is named
    data = bytearray(good)
    data[blk + 16 + 5] ^= 1
    e = refused(bad, bytes(data))
    assert e.offset == blk and "CRC" in e.message
    # meta flipped
    data = bytearray(good)
    data[17] ^= 1
    e = refused(bad, bytes(data))
    assert e.offset == 16 and "meta CRC" in e.message
    # magic, version, meta_len
    assert refused(bad, b"X" + good[1:]).offset == 0
    assert refused(bad, good[:8] + struct.pack("<I", 3) + good[12:]).offset == 8
    assert refused(bad, good[:8] + struct.pack("<I", 0) + good[12:]).offset == 8
    assert refused(bad, good[:12] + struct.pack("<I", (1 << 20) + 1) + good[16:]).offset == 12
    # bytes after the end
    e = refused(bad, good + b"\0")
    assert e.offset == len(good) and "follow" in e.message
    # wrong record count in the end marker (with a valid CRC)
    end = good.rindex(b"END1")
    n = struct.pack("<Q", 99)
    e = refused(bad, good[:end + 4] + n + struct.pack("<I", zlib.crc32(n)))
    assert e.offset == end + 4 and "99" in e.message
    # bad block tag
    e = refused(bad, good[:blk] + b"BLK2" + good[blk + 4:])
    assert e.offset == blk


def frame(payload: bytes, count: int, meta=b"{}", records=None, version=1) -> bytes:
    """A file with one hand-made block."""
    rec = struct.pack("<Q", count if records is None else records)
    return (b"SPWTRACE" + struct.pack("<II", version, len(meta)) + meta + struct.pack("<I", zlib.crc32(meta))
            + b"BLK1" + struct.pack("<III", len(payload), count, zlib.crc32(payload)) + payload
            + b"END1" + rec + struct.pack("<I", zlib.crc32(rec)))


PAYLOAD_AT = 16 + 2 + 4 + 16  # file offset of the payload in frame()


def test_framing_of_records(tmp_path):
    bad = tmp_path / "bad.spwt"
    step = bytes([6, 5])
    # count larger than the records
    e = refused(bad, frame(step, 2))
    assert e.offset == PAYLOAD_AT - 8 and "holds 1 records" in e.message
    # count smaller than the records
    e = refused(bad, frame(step + step, 1))
    assert e.offset == PAYLOAD_AT - 8 and "before its length" in e.message
    # a record cut by the block end (varint runs past)
    e = refused(bad, frame(bytes([6, 0x80]), 1))
    assert e.offset == PAYLOAD_AT + 1 and "past the end" in e.message
    # varint of 11 bytes
    e = refused(bad, frame(bytes([6] + [0x80] * 10 + [0]), 1))
    assert e.offset == PAYLOAD_AT + 1 and "10 bytes" in e.message
    # 10-byte varint above 2^64
    e = refused(bad, frame(bytes([6] + [0xFF] * 9 + [0x02]), 1))
    assert e.offset == PAYLOAD_AT + 1
    # unknown record type
    e = refused(bad, frame(step + bytes([11, 0]), 2, version=2))
    assert e.offset == PAYLOAD_AT + 2 and "unknown record type 11" in e.message
    # EVICT and RESTORE came in version 2
    alloc = bytes([2, 1, 8, 0, 0])
    for t in (9, 10):
        e = refused(bad, frame(alloc + bytes([t, 1, 0]), 2))
        assert e.offset == PAYLOAD_AT + 5 and f"record type {t} is unknown in version 1" in e.message
    bad.write_bytes(frame(alloc + bytes([9, 1, 0, 10, 1, 3]), 3, version=2))
    assert st.read(bad)[1][1:] == [st.Evict(1, 0), st.Restore(1, 3)]
    e = refused(bad, frame(bytes([0]), 1))
    assert e.offset == PAYLOAD_AT
    # zero-length and zero-count blocks
    e = refused(bad, frame(b"", 1))
    assert e.offset == PAYLOAD_AT - 12
    e = refused(bad, frame(step, 0, records=0))
    assert e.offset == PAYLOAD_AT - 8
    # a string running past its block: at the string's first byte
    e = refused(bad, frame(bytes([1, 1, 5, 65]), 1))
    assert e.offset == PAYLOAD_AT + 3 and "past the end" in e.message
    # a LAUNCH claiming more touches than its block can hold: at the count
    e = refused(bad, frame(bytes([4, 0, 0, 0, 2, 0, 0, 0, 0]), 1))
    assert e.offset == PAYLOAD_AT + 4 and "claims 2 touches" in e.message
    # end marker CRC: at END1
    good = frame(step, 1)
    e = refused(bad, good[:-1] + bytes([good[-1] ^ 1]))
    assert e.offset == len(good) - 16 and "end marker CRC" in e.message
    # meta must be a JSON object
    e = refused(bad, frame(step, 1, meta=b"[1]"))
    assert e.offset == 16
    # the hand-made good one reads
    bad.write_bytes(frame(step, 1))
    assert st.read(bad) == ({}, [st.Step(5)])


def semantic(tmp_path, fn):
    """Writes with the (non-validating) writer; returns the reader's error."""
    p = tmp_path / "s.spwt"
    data = write(p, fn)
    e = refused(p, data)
    assert 0 < e.offset < len(data)
    return e, data


def test_semantic_errors(tmp_path):
    cases = [
        (lambda w: w.launch(0, 7, 0, []), "string id 7 used before"),
        (lambda w: (w.write(st.String(1, "a")), w.write(st.String(1, "b"))), "defined twice"),
        (lambda w: w.write(st.String(0, "a")), "id 0"),
        (lambda w: (w.alloc(1, 10), w.copy(0, st.COPY_D2H, 8, 1, (0, 0), (1, 4))), "copy range [4, 12)"),
        (lambda w: (w.alloc(1, 10), w.copy(0, st.COPY_MEMSET, 8, 1, (1, 0), (0, 1))), "has a source"),
        (lambda w: w.alloc(1, 10, 0, 3), "string id 3"),
        (lambda w: (w.alloc(1, 10), w.free(1), w.alloc(1, 10)), "reuses"),
        (lambda w: w.alloc(0, 10), "allocation id 0"),
        (lambda w: w.free(1), "FREE names allocation 1"),
        (lambda w: (w.alloc(1, 10), w.free(1), w.free(1)), "not live"),
        (lambda w: (w.alloc(1, 10), w.launch(0, 0, 0, [(2, 0, 1, 1)])), "touch names allocation 2"),
        (lambda w: (w.alloc(1, 10), w.launch(0, 0, 0, [(1, 5, 6, 1)])), "outside allocation 1"),
        (lambda w: (w.alloc(1, 10), w.free(1), w.launch(0, 0, 0, [(1, 0, 1, 1)])), "not live"),
        (lambda w: (w.alloc(1, 10), w.launch(0, 0, 0, [(1, 0, 1, 4)])), "mode 4"),
        (lambda w: w.copy(0, st.COPY_H2D, 8, 1, (3, 0)), "copy reference names allocation 3"),
        (lambda w: w.copy(0, 5, 8, 1, (0, 0)), "copy kind 5"),
        (lambda w: w.phase(4), "phase 4"),
        (lambda w: w.duration(0, 5), "DURATION names launch 0"),
        (lambda w: (w.launch(0, 0, 0, []), w.duration(1, 5)), "launch 1"),
        (lambda w: w.evict(1), "EVICT names allocation 1"),
        (lambda w: (w.alloc(1, 10), w.restore(1)), "RESTORE of allocation 1, which is not evicted"),
        (lambda w: (w.alloc(1, 10), w.evict(1), w.evict(1)), "already evicted"),
        (lambda w: (w.alloc(1, 10), w.evict(1), w.free(1), w.restore(1)),
         "RESTORE names allocation 1"),
    ]
    for fn, text in cases:
        e, _ = semantic(tmp_path, fn)
        assert text in e.message, (text, e)


def test_move_cause_out_of_range_is_not_written_and_is_refused(tmp_path):
    with pytest.raises(ValueError):
        st.encode_record(st.Evict(1, 4))
    bad = tmp_path / "bad.spwt"
    e = refused(bad, frame(bytes([2, 1, 8, 0, 0, 9, 1, 4]), 2, version=2))
    assert e.offset == PAYLOAD_AT + 5 and "EVICT cause 4 is not 0-3" in e.message


def test_semantic_offset_points_at_record(tmp_path):
    def fn(w):
        w.alloc(1, 10)
        w.free(1)
        w.free(1)
    e, data = semantic(tmp_path, fn)
    # payload: ALLOC(5 bytes) FREE(3) FREE(3): the second FREE's type byte
    blk = data.index(b"BLK1")
    assert e.offset == blk + 16 + 5 + 3


def test_check_summary(tmp_path):
    p = tmp_path / "t.spwt"
    write(p)
    s = st.check(p)
    assert s["counts"]["Launch"] == 2 and s["counts"]["String"] == 2


def test_the_old_names_still_work(tmp_path):
    """Scripts written before "record" named the .spwt file keep working:
    `import spillway_trace`, `TraceError`, `harness/spillway_trace.py FILE`,
    `harness/record_trace.py`, and the folder `harness/traces/`."""
    import os
    import subprocess
    import sys

    import spillway_trace

    assert spillway_trace is st
    assert st.TraceError is st.RecordError
    harness = os.path.dirname(os.path.abspath(st.__file__))
    good = tmp_path / "good.spwt"
    good.write_bytes(write(tmp_path / "w.spwt"))
    old = subprocess.run([sys.executable, os.path.join(harness, "spillway_trace.py"), str(good)],
                         capture_output=True, text=True)
    assert old.returncode == 0 and f"{good}: ok" in old.stdout, old.stdout + old.stderr
    bad = tmp_path / "bad.spwt"
    bad.write_bytes(b"SPWTRACE")
    old = subprocess.run([sys.executable, os.path.join(harness, "spillway_trace.py"), str(bad)],
                         capture_output=True, text=True)
    assert old.returncode == 1 and "REFUSED" in old.stdout
    rec = subprocess.run([sys.executable, os.path.join(harness, "record_trace.py"), "--help"],
                         capture_output=True, text=True)
    assert rec.returncode == 0 and "--model" in rec.stdout, rec.stderr
    import record
    import record_trace

    assert record_trace is record
    assert os.path.samefile(os.path.join(harness, "traces", "gpt_varlen.spwt"),
                            os.path.join(harness, "records", "gpt_varlen.spwt"))


def test_a_short_fuzz_of_the_reader_finds_nothing():
    """fuzz/fuzz_record.py, briefly (docs/reliability.md, "The Python reader"):
    mutated records, framed again with the right CRCs, are read or refused
    with RecordError, never another exception."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(st.__file__)), "..", "fuzz"))
    import fuzz_record

    said = []
    findings = fuzz_record.run(inputs=3000, seed=1, log=said.append)
    assert not findings, findings[0][1]
    assert "3000 inputs" in said[-1] and " read, " in said[-1], said
