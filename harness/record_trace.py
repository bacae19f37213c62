#!/usr/bin/env python3
"""The old name of harness/record.py (records a model's allocations and
launches into a `.spwt` record), kept for scripts that run or import it:
the same options, the same module."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # noqa: E402

if __name__ == "__main__":
    sys.exit(record.main())
sys.modules[__name__] = record
