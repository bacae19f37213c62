import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
HARNESS = os.path.join(ROOT, "harness")
if HARNESS not in sys.path:
    sys.path.insert(0, HARNESS)
