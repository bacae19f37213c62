#!/usr/bin/env python3
"""Checks a SPILLWAY_TRACE file for tests/chrome_trace and prints a summary,
one "key value" line each.

    check_trace.py PATH [--tolerant]

Strict: the file must be one JSON array. --tolerant applies the rule of
Chrome's JSON Array Format for a trace that was cut off: the closing ']' may
be missing. A last line without its newline (a write cut by the kill) is
dropped first. Exit status 1 if the file does not parse.
"""
import json
import sys


def load(path, tolerant):
    text = open(path, encoding="utf-8").read()
    closed = text.rstrip().endswith("]")
    if tolerant and not closed:
        if not text.endswith("\n"):
            text = text[: text.rfind("\n") + 1]
        text = text.rstrip().rstrip(",") + "\n]"
    return json.loads(text), closed


def main():
    path = sys.argv[1]
    tolerant = "--tolerant" in sys.argv[2:]
    try:
        events, closed = load(path, tolerant)
    except (ValueError, OSError) as e:
        print(f"error {e}")
        return 1
    if not isinstance(events, list):
        print("error not an array")
        return 1
    out = {
        "closed": int(closed),
        "events": len(events),
        "kernels": 0,
        "kernels_device_clock": 0,
        "kernels_bad_time": 0,
        "memcpys": 0,
        "memsets": 0,
        "evictions": 0,
        "restores": 0,
        "bytes_evicted": 0,
        "bytes_restored": 0,
        "transfers_device_clock": 0,
        "transfers_with_cause": 0,
        "restores_for_a_call": 0,
        "transfers_with_site": 0,
        "memory_samples": 0,
        "max_resident_minus_budget": -(1 << 62),
        "ooms_avoided": 0,
        "stream_tracks": 0,
        "direction_tracks": 0,
        "has_end": 0,
        "has_start": 0,
        "versioned": 0,
        "schema": 0,
        "simulated": 0,
    }
    causes = {"budget", "pressure", "prefetch", "on-demand"}
    for e in events:
        ph, name, args = e.get("ph"), e.get("name", ""), e.get("args", {})
        cat = e.get("cat")
        if ph == "X" and cat == "kernel":
            out["kernels"] += 1
            out["kernels_device_clock"] += args.get("clock") == "device"
            if not isinstance(e.get("ts"), (int, float)) or e.get("dur", -1) < 0:
                out["kernels_bad_time"] += 1
        elif ph == "X" and cat == "memcpy":
            out["memcpys"] += 1
        elif ph == "X" and cat == "memset":
            out["memsets"] += 1
        elif ph == "X" and cat == "spillway" and name.startswith(("evict ", "restore ")):
            key = "evictions" if name.startswith("evict ") else "restores"
            out[key] += 1
            out["bytes_" + ("evicted" if key == "evictions" else "restored")] += args["bytes"]
            out["transfers_device_clock"] += args.get("clock") == "device"
            out["transfers_with_cause"] += args.get("cause") in causes and "block" in args
            out["restores_for_a_call"] += key == "restores" and "for_correlation" in args
            out["transfers_with_site"] += bool(args.get("site"))
        elif ph == "C" and name == "spillway memory":
            out["memory_samples"] += 1
            out["max_resident_minus_budget"] = max(
                out["max_resident_minus_budget"], args["resident_bytes"] - args["budget_bytes"]
            )
        elif ph == "i" and name == "OOM avoided":
            out["ooms_avoided"] += 1
        elif ph == "M" and name == "thread_name":
            if args["name"].startswith("stream "):
                out["stream_tracks"] += 1
            else:
                out["direction_tracks"] += 1
        elif name == "spillway trace start":
            out["has_start"] = 1
            out["simulated"] = int(args.get("simulated_time", False))
            # Which spillway wrote it: a version of three numbers, the JSON schema.
            v = str(args.get("spillway_version", ""))
            out["versioned"] = int(len(v.split(".")) == 3 and all(p.isdigit() for p in v.split(".")))
            out["schema"] = int(args.get("schema", 0))
        elif name == "spillway trace end":
            out["has_end"] = 1
            for k, v in args.items():
                out["end_" + k] = v
    for k, v in out.items():
        print(k, int(v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
