import ctypes
import os

import torch


class CUDAPluggableAllocator:
    # Like PyTorch's: loads the library and looks the two functions up.
    def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name):
        torch._record("CUDAPluggableAllocator", path_to_so_file, alloc_fn_name, free_fn_name)
        lib = ctypes.CDLL(path_to_so_file)
        self.alloc = ctypes.cast(getattr(lib, alloc_fn_name), ctypes.c_void_p).value
        self.free = ctypes.cast(getattr(lib, free_fn_name), ctypes.c_void_p).value


def change_current_allocator(allocator):
    torch._record("change_current_allocator", type(allocator).__name__, allocator.alloc is not None)
    if torch.cuda.is_initialized():
        raise RuntimeError("Can't swap an already initialized allocator")


if os.environ.get("FAKE_TORCH_OLD") == "1":
    del CUDAPluggableAllocator


# Under a pluggable allocator PyTorch's memory statistics raise (its
# CUDAPluggableAllocator has none): what these stand-ins do.
def _no_stats(*args, **kwargs):
    raise RuntimeError("CUDAPluggableAllocator does not yet support getDeviceStats. If you need "
                       "it, please file an issue describing your use case.")


memory_allocated = max_memory_allocated = memory_reserved = max_memory_reserved = _no_stats
memory_stats = reset_peak_memory_stats = memory_summary = _no_stats
reset_max_memory_allocated = reset_max_memory_cached = _no_stats
