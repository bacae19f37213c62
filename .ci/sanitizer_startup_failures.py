#!/usr/bin/env python3
"""Reads a ctest log (--output-on-failure) and says whether every failed test
failed only because a sanitizer runtime could not map its memory at start.

CI once lost a ThreadSanitizer run this way: a test's child process died
before main() with "ThreadSanitizer failed to allocate 0x1fdc22b7ff000 ...
bytes at address 100001001000 (errno: 12)", the kernel refusing the runtime's
fixed shadow mapping (ENOMEM) on a loaded machine. That is the environment,
not the code under test, so .ci/run reruns such tests once. Any other failure,
or a failed test whose output lacks the message, is not rerun.

Exit 0 and print the failed tests' numbers (one per line) when each failed
test's output has the message; exit 1 otherwise (nothing printed), and exit 2
on a log this script cannot read.
"""
import re
import sys

STATUS = re.compile(r"^\s*\d+/\d+ Test\s+#(\d+): ")
START = re.compile(r"^\s*Start\s+\d+: ")
FAILED_ENTRY = re.compile(r"^\s*(\d+) - \S+ \(([^)]*)\)")
# sanitizer_common's MmapFixed* failure: "<Tool> failed to allocate <hex>
# (<dec>) bytes at address <hex> (errno: 12)".
MMAP_ENOMEM = re.compile(
    r"(Thread|Address|Memory)Sanitizer failed to allocate 0x[0-9a-f]+ \(\d+\) bytes "
    r"at address [0-9a-f]+ \(errno: 12\)"
)


def failed_tests(lines):
    """The numbers in ctest's closing "The following tests FAILED:" list."""
    out = []
    try:
        at = lines.index("The following tests FAILED:")
    except ValueError:
        return None
    for line in lines[at + 1 :]:
        m = FAILED_ENTRY.match(line)
        if not m:
            break
        out.append(m.group(1))
    return out


def outputs(lines):
    """Each test's status line and the output ctest printed under it."""
    chunks, current = {}, None
    for line in lines:
        m = STATUS.match(line)
        if m:
            current = m.group(1)
            chunks[current] = [line]
        elif START.match(line) or line.startswith("The following tests"):
            current = None
        elif current is not None:
            chunks[current].append(line)
    return chunks


def main(argv):
    if len(argv) != 2:
        print("usage: sanitizer_startup_failures.py CTEST_LOG", file=sys.stderr)
        return 2
    try:
        with open(argv[1], errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        print(f"sanitizer_startup_failures.py: {e}", file=sys.stderr)
        return 2
    failed = failed_tests(lines)
    if not failed:
        return 1
    chunks = outputs(lines)
    for n in failed:
        if not any(MMAP_ENOMEM.search(l) for l in chunks.get(n, [])):
            return 1
    print("\n".join(failed))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
