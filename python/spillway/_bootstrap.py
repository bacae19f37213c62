"""Installs spillway as torch's CUDA allocator right after `torch` is imported.

Armed at interpreter start by the bootstrap's sitecustomize (libspillway.so's
constructor put it first on PYTHONPATH). arm() costs one entry in
sys.meta_path and imports nothing heavy: processes that never import torch
are untouched, and so are those that import torch but never use CUDA
(installing the allocator does not initialize CUDA, and spillway starts only at
its first allocation).

When `torch` finishes importing, once per process:
  1. if no libspillway.so is loaded in this process (a child that inherited
     PYTHONPATH but not LD_PRELOAD), nothing happens;
  2. a bad SPILLWAY_* variable raises spillway.ConfigError with the shim's
     message, from the `import torch` statement;
  3. torch.cuda.memory.change_current_allocator(CUDAPluggableAllocator(
     <library path>, "spillway_malloc", "spillway_free"));
     if CUDA is already initialized, torch is too old or has no CUDA, or the
     call raises: exactly one SpillwayWarning, and the job runs on PyTorch's
     own allocator;
  4. a global optimizer step post-hook marks steps (spillway_mark_step), see
     _on_optimizer_step;
  5. torch.cuda's memory functions (memory_allocated, max_memory_allocated,
     memory_reserved, max_memory_reserved, memory_stats,
     reset_peak_memory_stats, memory_summary and the deprecated
     reset_max_memory_*) are pointed at spillway's counters: under a pluggable
     allocator PyTorch's raise, and scripts that log memory would break;
  6. one warning if PYTORCH_CUDA_ALLOC_CONF (or PYTORCH_ALLOC_CONF) is set:
     its settings are for the allocator spillway replaces.
"""

import _thread
import sys

import spillway

_armed = False
_fired = False
_lock = _thread.allocate_lock()
# Set when the allocator was installed (tests and docs/python.md refer to it).
installed = False


def _warn(message):
    try:
        import warnings

        # warn_explicit: no source line of spillway's own in the output.
        warnings.warn_explicit("spillway: " + message, spillway.SpillwayWarning, "spillway", 0,
                               module="spillway")
    except Exception:  # -W error: a warning must never fail the job
        sys.stderr.write("[spillway W] %s\n" % message)


def _give_up(message):
    spillway._gave_up = True
    _warn(message + "; the job runs on PyTorch's own allocator")


class _TorchHook:
    """A meta-path finder that sees `torch` being imported and fires once it has been."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch" or _fired:
            return None
        spec = None
        for finder in list(sys.meta_path):
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        if spec is None:
            return None
        _disarm()
        loader = spec.loader
        real_exec = getattr(loader, "exec_module", None)
        if real_exec is None:
            return spec  # a legacy loader: nothing to wrap (torch never uses one)

        def exec_module(module):
            try:
                real_exec(module)
            finally:
                try:
                    del loader.exec_module  # the loader is the module's __loader__: restore it
                except AttributeError:
                    pass
            on_torch_imported(module)

        loader.exec_module = exec_module
        return spec

    def invalidate_caches(self):
        pass


_hook = _TorchHook()


def _disarm():
    try:
        sys.meta_path.remove(_hook)
    except ValueError:
        pass


def arm():
    """Called by the bootstrap's sitecustomize at interpreter start."""
    global _armed
    with _lock:
        if _armed:
            return
        _armed = True
    torch = sys.modules.get("torch")
    if torch is not None:  # imported before us (an embedding application)
        on_torch_imported(torch)
        return
    sys.meta_path.insert(0, _hook)


def on_torch_imported(torch):
    """Installs the allocator into this process's torch (once)."""
    global _fired, installed
    with _lock:
        if _fired:
            return
        _fired = True
    _disarm()
    try:
        lib = spillway._load()
    except Exception:
        lib = None
    if lib is None:
        return  # spillway is not in this process
    spillway.check_config()  # raises ConfigError: the job must not start on a bad setting

    try:
        cuda = getattr(torch, "cuda", None)
        memory = getattr(cuda, "memory", None)
        pluggable = getattr(memory, "CUDAPluggableAllocator", None)
        change = getattr(memory, "change_current_allocator", None)
        if pluggable is None or change is None:
            _give_up(
                "torch %s has no torch.cuda.memory.CUDAPluggableAllocator (PyTorch 2.0 or newer is "
                "needed)" % getattr(torch, "__version__", "?"))
            return
        version = getattr(torch, "version", None)
        if version is not None and getattr(version, "cuda", "") is None:
            _give_up("this torch (%s) is built without CUDA" % getattr(torch, "__version__", "?"))
            return
        if cuda.is_initialized():
            _give_up("CUDA was initialized before torch finished importing, too late to change "
                     "the allocator")
            return
        change(pluggable(spillway.library_path(), "spillway_malloc", "spillway_free"))
    except Exception as e:
        _give_up("installing the allocator failed (%s: %s)" % (type(e).__name__, e))
        return
    installed = True
    _hook_optimizer_steps(torch, lib)
    _point_memory_api_at_spillway(torch)
    import os

    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        if os.environ.get(name):
            _warn("%s=%s is set, but its settings are for PyTorch's own CUDA allocator, which "
                  "spillway replaces: they have no effect (spillway's settings are the SPILLWAY_* "
                  "variables, docs/config.md)" % (name, os.environ[name]))
            break


# torch.cuda memory function -> spillway's (spillway/__init__.py).
_MEMORY_API = {
    "memory_allocated": "memory_allocated",
    "max_memory_allocated": "max_memory_allocated",
    "memory_reserved": "memory_reserved",
    "max_memory_reserved": "max_memory_reserved",
    "memory_stats": "memory_stats",
    "reset_peak_memory_stats": "reset_peak_memory_stats",
    "reset_max_memory_allocated": "reset_peak_memory_stats",
    "reset_max_memory_cached": "reset_peak_memory_stats",
    "memory_summary": "memory_summary",
}


def _point_memory_api_at_spillway(torch):
    """torch.cuda.<memory function> and torch.cuda.memory.<...> become spillway's."""
    cuda = getattr(torch, "cuda", None)
    for module in (cuda, getattr(cuda, "memory", None)):
        if module is None:
            continue
        for name, ours in _MEMORY_API.items():
            if hasattr(module, name):
                try:
                    setattr(module, name, getattr(spillway, ours))
                except Exception:
                    pass


def _hook_optimizer_steps(torch, lib):
    """Marks a step after each step of the first optimizer that steps (see docs/python.md)."""
    try:
        import importlib

        register = importlib.import_module("torch.optim.optimizer").register_optimizer_step_post_hook
    except Exception:
        return  # torch < 2.0 has no global optimizer hooks: steps are then marked by hand
    import weakref

    first = [None]  # weakref to the optimizer whose steps mark steps
    is_initialized = torch.cuda.is_initialized
    mark = lib.spillway_mark_step

    def _on_optimizer_step(optimizer, args, kwargs):
        if not spillway._auto_mark:
            return
        ref = first[0]
        owner = ref() if ref is not None else None
        if owner is None:
            try:
                first[0] = weakref.ref(optimizer)
            except TypeError:
                return
        elif owner is not optimizer:
            return  # a second optimizer in the same iteration (GAN, ...): one mark per iteration
        if is_initialized():  # never the call that starts CUDA (a CPU-only optimizer)
            mark()

    try:
        register(_on_optimizer_step)
    except Exception:
        pass
