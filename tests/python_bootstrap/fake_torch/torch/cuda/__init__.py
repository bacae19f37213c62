import os

_initialized = os.environ.get("FAKE_TORCH_CUDA_INITIALIZED") == "1"


def is_initialized():
    return _initialized


def _lazy_init():
    """What the first CUDA tensor would do."""
    global _initialized
    _initialized = True


from . import memory  # noqa: E402
