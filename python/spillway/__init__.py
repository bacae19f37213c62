"""spillway's Python API: ctypes over the C ABI of libspillway.so (shim/include/spillway.h).

Pure Python, no build step, and importable whether or not spillway is in the
process: every function works on the libspillway.so already loaded in this
process (preloaded with LD_PRELOAD, or loaded by torch's
CUDAPluggableAllocator) and does nothing harmful when there is none.

    import spillway
    spillway.enabled()                      # is spillway serving this process?
    spillway.stats()                        # the shim's counters (spillway_stats_json)
    spillway.memory_stats()                 # the same, under torch.cuda.memory_stats()'s key names
    spillway.memory_summary()               # torch.cuda.memory_summary()'s table, human sizes
    spillway.reset_peak_memory_stats()      # the peaks start again from now
    spillway.mark_step()                    # end of a training step
    with spillway.pinned(weight, (ptr, n)): # keep these blocks resident on the GPU
        ...

docs/python.md documents every function and each key of memory_stats().
"""

import _thread
import os

# spillway's version (semantic): project()'s VERSION in CMakeLists.txt, which
# libspillway.so reports through spillway_version() (a test compares them).
__version__ = "0.1.0"

__all__ = [
    "__version__",
    "ConfigError",
    "SpillwayWarning",
    "enabled",
    "library_path",
    "stats",
    "memory_stats",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "memory_summary",
    "mark_step",
    "set_auto_mark_step",
    "pinned",
    "check_config",
]


class ConfigError(RuntimeError):
    """A SPILLWAY_* variable is not valid; the message is the shim's (docs/config.md)."""


class SpillwayWarning(RuntimeWarning):
    """spillway could not be installed; the job runs on PyTorch's own allocator."""


_lock = _thread.allocate_lock()  # not threading: keep start-up imports minimal
_lib = None  # ctypes handle, or False when looked for and not found
_lib_path = None
# Set by spillway._bootstrap when it gave up installing the allocator.
_gave_up = False
# Automatic step marking from optimizer steps (see spillway._bootstrap).
_auto_mark = True


def _candidates():
    """Paths of the libspillway*.so objects mapped into this process."""
    found = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(None, 5)
                if len(fields) < 6:
                    continue
                path = fields[5].rstrip("\n")
                if not path.startswith("/") or path.endswith(" (deleted)"):
                    continue
                base = os.path.basename(path)
                if base.startswith("libspillway") and ".so" in base and path not in found:
                    found.append(path)
    except OSError:
        pass
    return found


def _load():
    """The loaded libspillway.so as a ctypes.CDLL, or None. Never loads a new copy."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib or None
    with _lock:
        if _lib is not None:
            return _lib or None
        import ctypes

        lib = None
        for path in _candidates():
            try:
                handle = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
                handle.spillway_stats_json
            except (OSError, AttributeError):
                continue
            lib, _lib_path = handle, path
            break
        if lib is None:
            _lib = False
            return None
        size_t, void_p = ctypes.c_size_t, ctypes.c_void_p
        lib.spillway_stats_json.argtypes = [ctypes.c_char_p, size_t]
        lib.spillway_stats_json.restype = size_t
        lib.spillway_mark_step.argtypes = []
        lib.spillway_mark_step.restype = None
        lib.spillway_pin.argtypes = [void_p, size_t]
        lib.spillway_pin.restype = ctypes.c_int
        lib.spillway_unpin.argtypes = [void_p, size_t]
        lib.spillway_unpin.restype = ctypes.c_int
        lib.spillway_malloc.argtypes = [size_t, ctypes.c_int, void_p]
        lib.spillway_malloc.restype = void_p
        lib.spillway_free.argtypes = [void_p, size_t, ctypes.c_int, void_p]
        lib.spillway_free.restype = None
        if hasattr(lib, "spillway_prefetch"):
            lib.spillway_prefetch.argtypes = [void_p, size_t]
            lib.spillway_prefetch.restype = ctypes.c_int
        if hasattr(lib, "spillway_reset_peak_stats"):
            lib.spillway_reset_peak_stats.argtypes = []
            lib.spillway_reset_peak_stats.restype = None
        if hasattr(lib, "spillway_check_config"):
            lib.spillway_check_config.argtypes = [ctypes.c_char_p, size_t]
            lib.spillway_check_config.restype = ctypes.c_int
        _lib = lib
        return lib


def library_path():
    """Absolute path of the libspillway.so loaded in this process, or None."""
    return _lib_path if _load() is not None else None


def enabled():
    """True when libspillway.so is loaded in this process and the bootstrap did not give up.

    The bootstrap gives up (with one SpillwayWarning) when CUDA was initialized
    before torch finished importing, when torch is too old or has no CUDA, or
    when installing the allocator raised. False when the library is absent.
    """
    return _load() is not None and not _gave_up


def check_config():
    """Raises ConfigError with the shim's message if a SPILLWAY_* variable is not valid.

    Starts nothing (spillway_check_config). Does nothing when the library is absent.
    """
    lib = _load()
    if lib is None or not hasattr(lib, "spillway_check_config"):
        return
    import ctypes

    buf = ctypes.create_string_buffer(4096)
    if lib.spillway_check_config(buf, len(buf)) != 0:
        raise ConfigError(buf.value.decode("utf-8", "replace"))


def stats():
    """The shim's counters: the dict of spillway_stats_json (docs/config.md lists the keys).

    All zeros until spillway serves its first allocation; {} when the library is absent.
    """
    lib = _load()
    if lib is None:
        return {}
    import ctypes

    size = lib.spillway_stats_json(None, 0) + 64  # counters may grow between the calls
    while True:
        buf = ctypes.create_string_buffer(size)
        need = lib.spillway_stats_json(buf, size)
        if need < size:
            import json

            return json.loads(buf.value.decode("utf-8"))
        size = need + 64


# torch.cuda.memory_stats() key -> how it is computed from stats(); the
# "spillway." keys are what PyTorch's allocator has no counter for.
# docs/python.md explains each one and lists the keys that are absent. Peaks
# are PyTorch's: since the last reset_peak_memory_stats.
_MEMORY_STATS = {
    "allocated_bytes.all.current": lambda s: s["live_bytes"],
    "allocated_bytes.all.peak": lambda s: s["recent_peak_live_bytes"],
    "requested_bytes.all.current": lambda s: s["live_bytes"],
    "requested_bytes.all.peak": lambda s: s["recent_peak_live_bytes"],
    "active_bytes.all.current": lambda s: s["live_bytes"],
    "active_bytes.all.peak": lambda s: s["recent_peak_live_bytes"],
    "reserved_bytes.all.current": lambda s: s["resident_bytes"],
    "reserved_bytes.all.peak": lambda s: s["recent_peak_resident_bytes"],
    "reserved_bytes.small_pool.current": lambda s: s["small_pool_bytes"],
    "allocation.all.allocated": lambda s: s["mallocs"],
    "allocation.all.freed": lambda s: s["frees"],
    "allocation.all.current": lambda s: s["mallocs"] - s["frees"],
    "num_alloc_retries": lambda s: s["cached_releases"],
    "num_ooms": lambda s: s["ooms"],
    "num_device_alloc": lambda s: s["device_creates"],
    "spillway.budget_bytes": lambda s: s["budget_bytes"],
    "spillway.host_bytes.current": lambda s: s["host_bytes"],
    "spillway.host_bytes.peak": lambda s: s["peak_host_bytes"],
    "spillway.evicted_bytes": lambda s: s["bytes_evicted"],
    "spillway.evicted_blocks": lambda s: s["blocks_evicted"],
    "spillway.restored_bytes": lambda s: s["bytes_restored"],
    "spillway.restored_blocks": lambda s: s["blocks_restored"],
    "spillway.evictions_cancelled": lambda s: s["evictions_cancelled"],
    "spillway.prefetches_used": lambda s: s["prefetches_used"],
    "spillway.transfer_wait_ns": lambda s: s["transfer_wait_ns"],
}


def memory_stats(device=None):
    """spillway's counters under torch.cuda.memory_stats()'s key names, sorted like it.

    Under spillway, torch.cuda.memory_stats() raises (a pluggable allocator has
    no stats). Only keys that have a meaning here are present; docs/python.md
    gives each mapping. `device` is accepted for compatibility: the counters are
    summed over the devices of the process (one GPU per process is the norm).
    {} when spillway is not enabled, like torch before CUDA is initialized.
    """
    del device
    import collections

    if not enabled():
        return collections.OrderedDict()
    return _memory_stats_of(stats())


def _memory_stats_of(s):
    import collections

    return collections.OrderedDict(sorted((k, int(f(s))) for k, f in _MEMORY_STATS.items()))


def memory_allocated(device=None):
    """Bytes of live allocations (torch.cuda.memory_allocated's counterpart)."""
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=None):
    """Peak bytes of live allocations since the process started."""
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=None):
    """Device memory spillway holds now (torch.cuda.memory_reserved's counterpart)."""
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device=None):
    """Peak device memory spillway held: never above the budget."""
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device=None):
    """The peaks of memory_stats() start again from the current levels.

    torch.cuda.reset_peak_memory_stats's counterpart (spillway_reset_peak_stats):
    max_memory_allocated() and max_memory_reserved() then report the peaks since
    this call. The process's own peaks (stats()'s peak_* keys, the exit summary)
    stay. No-op when spillway is not enabled.
    """
    del device
    lib = _load()
    if lib is not None and not _gave_up and hasattr(lib, "spillway_reset_peak_stats"):
        lib.spillway_reset_peak_stats()


def _format_size(n):
    """A size as a person reads it: '   512 B  ', '   5.0 MiB', '  12.3 GiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return "%6d %-3s" % (n, unit) if unit == "B" else "%6.1f %-3s" % (n, unit)
        n /= 1024.0


def _format_count(n):
    """A count: '    37   ', '   1.2 K ', '   3.4 M '."""
    for unit in ("", "K", "M"):
        if n < 1000 or unit == "M":
            return "%6d %-2s" % (n, unit) if unit == "" else "%6.1f %-2s" % (n, unit)
        n /= 1000.0


def memory_summary(device=None, abbreviated=False):
    """torch.cuda.memory_summary()'s table from spillway's counters, sizes in KiB/MiB/GiB.

    Rows as PyTorch's where the meaning is the same (allocated, reserved: the
    device memory spillway holds, allocations), then what spillway adds: host
    memory, bytes evicted and restored, the budget. `abbreviated` is accepted
    for compatibility (the table is always short). "" when spillway is not
    enabled.
    """
    del abbreviated
    if not enabled():
        return ""
    s = stats()
    m = _memory_stats_of(s)  # one reading of the counters for the whole table
    width = 75
    rule = "|" + "=" * width + "|"
    thin = "|" + "-" * width + "|"

    def center(text):
        return "|" + text.center(width) + "|"

    def row(metric, cur, peak, total, freed, fmt):
        cells = [metric.ljust(21)] + [(fmt(v) if v is not None else "").rjust(10)
                                      for v in (cur, peak, total, freed)]
        return "| " + " | ".join(cells) + " |"

    budget = s["budget_bytes"]
    lines = [
        rule,
        center("spillway CUDA memory summary, device ID %s" % (0 if device is None else device)),
        thin,
        center("CUDA OOMs: %d  |  cached blocks released: %d  |  budget: %s" % (
            s["ooms"], s["cached_releases"], _format_size(budget).strip() if budget else "none")),
        rule,
        "| " + " | ".join(["Metric".center(21)] + [h.center(10) for h in (
            "Cur Usage", "Peak Usage", "Tot Moved", "Tot Back")]) + " |",
        thin,
        row("Allocated memory", m["allocated_bytes.all.current"], m["allocated_bytes.all.peak"],
            None, None, _format_size),
        row("GPU reserved memory", m["reserved_bytes.all.current"], m["reserved_bytes.all.peak"],
            None, None, _format_size),
        row("Host memory (evicted)", s["host_bytes"], s["peak_host_bytes"], None, None,
            _format_size),
        row("Evicted / restored", None, None, s["bytes_evicted"], s["bytes_restored"], _format_size),
        thin,
        row("Allocations", m["allocation.all.current"], None, m["allocation.all.allocated"],
            m["allocation.all.freed"], _format_count),
        row("Blocks evicted", None, None, s["blocks_evicted"], s["blocks_restored"], _format_count),
        rule,
        center("sizes summed over this process's devices; peaks since the last reset"),
        rule,
    ]
    return "\n".join(lines) + "\n"


def mark_step():
    """Marks the end of a training step (spillway_mark_step).

    Calling it turns off the automatic marking from optimizer steps for the rest
    of the process, so that a step is never counted twice. No-op when spillway
    is not enabled.
    """
    global _auto_mark
    _auto_mark = False
    lib = _load()
    if lib is not None and not _gave_up:
        lib.spillway_mark_step()


def set_auto_mark_step(on):
    """Turns the automatic step marking from optimizer steps on or off (on by default)."""
    global _auto_mark
    _auto_mark = bool(on)


def _extent(item):
    """(address, size) of a tensor's storage, or of a (ptr, size) pair."""
    if isinstance(item, tuple):
        ptr, size = item
        return int(ptr), int(size)
    storage = None
    for name in ("untyped_storage", "storage"):
        get = getattr(item, name, None)
        if get is not None:
            try:
                storage = get()
                break
            except Exception:
                storage = None
    if storage is not None and hasattr(storage, "data_ptr") and hasattr(storage, "nbytes"):
        return int(storage.data_ptr()), int(storage.nbytes())
    return int(item.data_ptr()), int(item.numel() * item.element_size())


def prefetch(*items):
    """Starts bringing evicted blocks back to the GPU without waiting (spillway_prefetch).

        spillway.prefetch(saved_activation, (ptr, size))

    Each argument is a tensor (its whole storage) or an (address, size) pair. A
    hint for what the job uses next: the copy runs while the job goes on, and the
    next use waits only for what of it has not landed. Blocks that do not fit in
    the budget without evicting another stay where they are. No-op when spillway
    is not enabled.
    """
    lib = _load()
    if lib is None or _gave_up or not hasattr(lib, "spillway_prefetch"):
        return
    for item in items:
        ptr, size = _extent(item)
        if ptr:
            lib.spillway_prefetch(ptr, size)


class pinned:
    """Keeps blocks resident on the GPU inside a `with` block (spillway_pin/spillway_unpin).

        with spillway.pinned(weight, kv_cache, (ptr, size)):
            ...

    Each argument is a tensor (its whole storage is pinned) or an (address, size)
    pair. A block that was evicted is brought back on entry; pinned blocks are
    never evicted until the block exits. Pins nest. No-op when spillway is not
    enabled (or the tensor is not one of spillway's blocks).
    """

    def __init__(self, *items):
        self._ranges = [_extent(i) for i in items]
        self._done = []

    def __enter__(self):
        lib = _load()
        if lib is None or _gave_up:
            return self
        try:
            for ptr, size in self._ranges:
                if ptr and lib.spillway_pin(ptr, size) == 0:
                    self._done.append((ptr, size))
        except BaseException:
            self._release(lib)
            raise
        return self

    def __exit__(self, *exc):
        lib = _load()
        if lib is not None:
            self._release(lib)
        return False

    def _release(self, lib):
        while self._done:
            ptr, size = self._done.pop()
            lib.spillway_unpin(ptr, size)
