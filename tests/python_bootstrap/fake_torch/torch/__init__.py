"""A stand-in `torch` for the bootstrap tests: records what spillway's bootstrap calls.

Every call is appended as one JSON line to the file named by FAKE_TORCH_LOG.
FAKE_TORCH_CUDA_INITIALIZED=1: torch.cuda.is_initialized() is True from the start.
FAKE_TORCH_OLD=1: no torch.cuda.memory.CUDAPluggableAllocator (PyTorch < 2.0).
FAKE_TORCH_NO_CUDA=1: torch.version.cuda is None (a CPU-only build).
"""
import json
import os

__version__ = "2.5.0+fake"


def _record(call, *args):
    path = os.environ.get("FAKE_TORCH_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"call": call, "args": list(args), "pid": os.getpid()}) + "\n")


_record("import torch")

from . import version  # noqa: E402
from . import cuda  # noqa: E402
from . import optim  # noqa: E402
