#!/usr/bin/env python3
"""The old name of spillway_record (the `.spwt` record's reader and writer),
kept for scripts that import it or run it: "trace" now means the
Chrome/Perfetto file only, "record" the `.spwt` file (docs/record-format.md).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spillway_record  # noqa: E402

if __name__ == "__main__":
    sys.exit(spillway_record.main())
sys.modules[__name__] = spillway_record
