#!/usr/bin/env python3
"""Sums the output of docs/wip/driver-call-probe.patch (session 33): run a
replay with WIP_PROBE=1 and stderr to a file, then
`driver_call_probe.py FILE K [N]` prints, for the K-th "PROBE step mark"
dump (the step that mark ended; the replayer's baseline child dumps first),
the N costliest (thread, driver call, allocator sites) by virtual host time.
Simulated time."""
import sys, re
lines = open(sys.argv[1]).read().splitlines()
idx = [i for i, l in enumerate(lines) if l.startswith('PROBE step mark')]
which = int(sys.argv[2])  # index of the mark whose dump to show
start = idx[which] + 1
end = idx[which + 1] if which + 1 < len(idx) else len(lines)
rows = []
for l in lines[start:end]:
    m = re.match(r'PROBE\s+(\S+) (\S+) @(\S*)\s+([\d.]+) us\s+(\d+) calls', l)
    if m: rows.append((float(m.group(4)), m.group(1), m.group(2), m.group(3), int(m.group(5))))
for th in ('job', 'mover'):
    r = [x for x in rows if x[1] == th]
    print(f"{th}: total {sum(x[0] for x in r)/1e3:.2f} ms in driver calls")
    for x in sorted(r, reverse=True)[:int(sys.argv[3]) if len(sys.argv) > 3 else 12]:
        print(f"  {x[0]:9.1f} us {x[4]:5d}  {x[2]:22s} {x[3]}")
