#!/usr/bin/python3
"""A mutation fuzzer for the Python `.spwt` reader (harness/spillway_record.py),
the one the recorder's tests, report.py and to_memory_snapshot.py read with.

    /usr/bin/python3 fuzz/fuzz_record.py [--seconds 60] [--seed 1] [--out DIR]

Its inputs start from the committed seeds of the C++ target
(fuzz/corpus/spwt/*.spwt) and the committed records (harness/records/, the
small ones). Each input is a seed taken apart into its header, meta, block
payloads and end marker, mutated (bytes flipped, set to 0x00/0x7f/0x80/0xff,
inserted, deleted, duplicated; a block's payload spliced with another's;
the meta's JSON replaced; the version, a block's record count or the end's
total changed), then framed again with lengths and CRCs set right, so that
the mutations reach the records rather than stopping at a CRC. The reader
must either read it or refuse it with `RecordError`; any other exception is
a finding: the input is written to DIR (default build-fuzz/artifacts/record_py)
and the run exits 1. Deterministic for a seed and a count of inputs.
"""
import argparse
import glob
import os
import random
import struct
import sys
import tempfile
import time
import traceback
import zlib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "harness"))
import spillway_record as st  # noqa: E402


def seeds():
    paths = sorted(glob.glob(os.path.join(REPO, "fuzz", "corpus", "spwt", "*.spwt")))
    paths += [os.path.join(REPO, "harness", "records", n) for n in ("gpt_varlen.spwt",)]
    out = []
    for p in paths:
        with open(p, "rb") as f:
            out.append(f.read())
    return out


def split(data):
    """(version, meta, [(count, payload)], records) of a framed file, as far as
    it is framed; None where the header itself is not."""
    if len(data) < 16 or data[:8] != st.MAGIC:
        return None
    version, meta_len = struct.unpack_from("<II", data, 8)
    meta = data[16:16 + meta_len]
    pos = 16 + meta_len + 4
    blocks, records = [], 0
    while pos + 4 <= len(data):
        tag = data[pos:pos + 4]
        if tag == st.END_TAG and pos + 12 <= len(data):
            (records,) = struct.unpack_from("<Q", data, pos + 4)
            break
        if tag != st.BLOCK_TAG or pos + 16 > len(data):
            break
        length, count, _ = struct.unpack_from("<III", data, pos + 4)
        blocks.append((count, data[pos + 16:pos + 16 + length]))
        pos += 16 + length
    return version, meta, blocks, records


def frame(version, meta, blocks, records):
    out = bytearray(st.MAGIC + struct.pack("<II", version, len(meta)) + meta +
                    struct.pack("<I", zlib.crc32(meta)))
    for count, payload in blocks:
        out += st.BLOCK_TAG + struct.pack("<III", len(payload), count, zlib.crc32(payload)) + payload
    rec = struct.pack("<Q", records)
    out += st.END_TAG + rec + struct.pack("<I", zlib.crc32(rec))
    return bytes(out)


def mutate_bytes(rng, b):
    b = bytearray(b)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        i = rng.randrange(len(b) + 1)
        if op == 0 and b:
            b[min(i, len(b) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1 and b:
            b[min(i, len(b) - 1)] = rng.choice((0x00, 0x7F, 0x80, 0xFF))
        elif op == 2:
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 3 and b:
            del b[i:i + rng.randint(1, 8)]
        elif op == 4 and b:
            j = rng.randrange(len(b))
            b[i:i] = b[j:j + rng.randint(1, 16)]
        elif op == 5:
            b[i:i] = b"\xff" * rng.randint(1, 10)  # a varint that does not end
    return bytes(b)


def mutate(rng, data, others):
    parts = split(data)
    if parts is None or rng.random() < 0.02:
        return mutate_bytes(rng, data)  # the framing itself
    version, meta, blocks, records = parts
    what = rng.randrange(10)
    if what < 5 and blocks:
        k = rng.randrange(len(blocks))
        count, payload = blocks[k]
        blocks[k] = (count, mutate_bytes(rng, payload))
    elif what == 5 and blocks:
        other = split(rng.choice(others))
        if other and other[2]:
            k = rng.randrange(len(blocks))
            count, payload = blocks[k]
            _, theirs = rng.choice(other[2])
            cut = rng.randrange(len(payload) + 1)
            blocks[k] = (count, payload[:cut] + theirs[rng.randrange(len(theirs) + 1):])
    elif what == 6:
        meta = (mutate_bytes(rng, meta) if rng.random() < 0.5 else
                rng.choice([b"{}", b"[]", b"null", b"{\"steps\": -1}", b"{\"layers\": 1e300}",
                            b"\xff\xfe", b"{\"steps\": \"2\"}", b""]))
    elif what == 7:
        version = rng.choice((0, st.OLDEST_VERSION, st.VERSION, st.VERSION + 1, 0xFFFFFFFF))
    elif what == 8 and blocks:
        k = rng.randrange(len(blocks))
        blocks[k] = (rng.choice((0, 1, blocks[k][0] + 1, 0xFFFFFFFF)), blocks[k][1])
    else:
        records = rng.choice((0, records + 1, max(records - 1, 0), (1 << 64) - 1))
    return frame(version, meta, blocks, records)


def run(seconds=None, inputs=None, seed=1, out=None, log=print):
    """Fuzzes for `seconds` of wall time or `inputs` inputs; returns the
    findings as (input bytes, traceback text)."""
    rng = random.Random(seed)
    pool = seeds()
    findings = []
    counts = {"read": 0, "refused": 0}
    start = time.time()
    fd, path = tempfile.mkstemp(suffix=".spwt")
    os.close(fd)
    try:
        n = 0
        while (inputs is None or n < inputs) and (seconds is None or time.time() - start < seconds):
            data = mutate(rng, rng.choice(pool), pool)
            n += 1
            with open(path, "wb") as f:
                f.write(data)
            try:
                st.read(path)
                counts["read"] += 1
                if len(pool) < 256 and rng.random() < 0.05:
                    pool.append(data)  # a mutant that reads: mutated further later
            except st.RecordError:
                counts["refused"] += 1
            except Exception:  # noqa: BLE001 - anything but a refusal is a finding
                findings.append((data, traceback.format_exc()))
                if out:
                    os.makedirs(out, exist_ok=True)
                    name = os.path.join(out, f"finding-{len(findings)}.spwt")
                    with open(name, "wb") as f:
                        f.write(data)
                    log(f"fuzz_record: finding {len(findings)} written to {name}:\n"
                        + findings[-1][1])
    finally:
        os.unlink(path)
    log(f"fuzz_record: {n} inputs in {time.time() - start:.0f} s (seed {seed}): "
        f"{counts['read']} read, {counts['refused']} refused, {len(findings)} findings")
    return findings


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(REPO, "build-fuzz", "artifacts", "record_py"))
    a = ap.parse_args(argv)
    return 1 if run(seconds=a.seconds, seed=a.seed, out=a.out) else 0


if __name__ == "__main__":
    sys.exit(main())
