import os

_initialized = os.environ.get("FAKE_TORCH_CUDA_INITIALIZED") == "1"


def is_initialized():
    return _initialized


def _lazy_init():
    """What the first CUDA tensor would do."""
    global _initialized
    _initialized = True


from . import memory  # noqa: E402
from .memory import (  # noqa: E402,F401  re-exported, as torch.cuda does
    max_memory_allocated, max_memory_reserved, memory_allocated, memory_reserved, memory_stats,
    memory_summary, reset_max_memory_allocated, reset_max_memory_cached, reset_peak_memory_stats)
