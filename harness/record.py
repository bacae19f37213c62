#!/usr/bin/python3
"""Records a PyTorch training job, run on CPU, as a spillway trace (.spwt).

    /usr/bin/python3 harness/record.py --model FILE.py --out TRACE [--steps N]
        [--meta] [--set KEY=VALUE ...]

FILE.py defines build(**kwargs) returning a dict with `model`, `batches` (a
list of (input, target)), `loss_fn`, and optionally `optimizer` (default
torch.optim.AdamW(model.parameters())).  `--set` passes keyword arguments to
build().  A model whose parameters are on the `meta` device (or any model with
--meta, which moves it there) is recorded without computing anything.

How it sees PyTorch (details in harness/README.md):
- a TorchDispatchMode sees every aten op below autograd with its real inputs
  and outputs, in PyTorch's order (forward, the autograd engine's backward,
  the optimizer);
- a storage is identified by its StorageImpl (`_cdata`); a new StorageImpl among
  an op's outputs is an allocation of `nbytes()` bytes (PyTorch's size);
- a weak reference to each live StorageImpl (StorageWeakRef) is polled before
  every op and at every marker: an expired one was freed (its last tensor,
  wherever held, including autograd's saved variables, is gone).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.util
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import spillway_record as st  # noqa: E402

import torch  # noqa: E402
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_map  # noqa: E402

# ------------------------------------------------------------------ cost model
# An H100 SXM (design.md section 8): achieved bf16 tensor-core matmul
# ~790 TFLOP/s, HBM ~3 TB/s, PCIe Gen5 ~55 GB/s per direction (pinned).
COST_MODEL = {
    "name": "h100-roofline-v1",
    "matmul_flops_per_s": {"bfloat16": 790e12, "float16": 790e12, "float32": 395e12},
    "vector_flops_per_s": 60e12,
    "hbm_bytes_per_s": 3.0e12,
    "pcie_bytes_per_s": 55e9,
    "launch_floor_ns": 2000,
    "formula": "duration = max(flops / peak(dtype, op class), bytes touched / hbm) + floor; "
               "copies: bytes / pcie + floor. matmul flops = 2*M*N*K (mm, addmm, bmm, baddbmm), "
               "convolution = 2 * output elements * Cin/groups * kernel area (backward: once per "
               "gradient produced), fused causal attention 2*B*H*L*L*D (backward 2.5x); other ops: one flop per output element. bytes = sum of touched "
               "ranges (read-and-write counted twice). float32 matmuls assume TF32 tensor cores.",
}

_MATMUL = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "_addmm_activation"}
_CONV = {"convolution", "_convolution", "mkldnn_convolution", "_slow_conv2d_forward",
         "thnn_conv2d", "conv2d"}
_ALLOC_ONLY = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
               "_empty_affine_quantized"}
# metadata queries: a result computed on the host from sizes alone, no kernel
# (is_same_size: torch.autograd.backward's check of given gradients, as in
# checkpoint(use_reentrant=True)'s backward)
_NO_KERNEL = {"is_same_size"}


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def op_flops(name: str, args, outs) -> tuple[int, str]:
    """(flops, class) of one aten op; class 'matmul' or 'vector'."""
    try:
        if name in _MATMUL:
            out = outs[0]
            # the reduced dimension: last dim of the first matrix operand
            mats = [a for a in args if isinstance(a, torch.Tensor) and a.dim() >= 2]
            k = int(mats[0].shape[-1]) if name in ("mm", "bmm") else int(mats[1].shape[-1])
            if name == "addbmm":
                k = int(mats[1].shape[-1]) * int(mats[1].shape[0])
            return 2 * _numel(out.shape) * k, "matmul"
        if name in _CONV:
            out, weight = outs[0], args[1]
            return 2 * _numel(out.shape) * _numel(weight.shape[1:]), "matmul"
        if name == "convolution_backward":
            grad_out, weight = args[0], args[2]
            mask = args[-1] if isinstance(args[-1], (list, tuple)) else (True, True, True)
            per = 2 * _numel(grad_out.shape) * _numel(weight.shape[1:])
            return per * (int(bool(mask[0])) + int(bool(mask[1]))), "matmul"
        if name in ("flash_attn", "flash_attn_backward"):
            # fused causal attention on (B, L, H, D): QK^T and PV, half masked;
            # backward recomputes QK^T and does four more products (2.5x)
            q = args[1] if name == "flash_attn_backward" else args[0]
            b, l, h, d = (int(x) for x in q.shape)
            fwd = 2 * 2 * b * h * l * l * d // 2
            return (fwd * 5 // 2 if name == "flash_attn_backward" else fwd), "matmul"
    except (IndexError, TypeError, AttributeError):
        pass
    n = sum(_numel(o.shape) for o in outs if isinstance(o, torch.Tensor))
    return n, "vector"


def op_duration_ns(name: str, args, outs, nbytes: int, dtype: torch.dtype) -> int:
    flops, cls = op_flops(name, args, outs)
    if cls == "matmul":
        peak = COST_MODEL["matmul_flops_per_s"].get(str(dtype).replace("torch.", ""), 395e12)
    else:
        peak = COST_MODEL["vector_flops_per_s"]
    t = max(flops / peak, nbytes / COST_MODEL["hbm_bytes_per_s"])
    return int(t * 1e9) + COST_MODEL["launch_floor_ns"]


def copy_duration_ns(nbytes: int) -> int:
    return int(nbytes / COST_MODEL["pcie_bytes_per_s"] * 1e9) + COST_MODEL["launch_floor_ns"]


# ------------------------------------------------------------------ recorder

_view_cache: dict = {}


def _is_view(func) -> bool:
    """True for ops whose results only alias their inputs (no kernel on a GPU)."""
    v = _view_cache.get(func)
    if v is None:
        rets = func._schema.returns
        v = bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)
        _view_cache[func] = v
    return v


def _called_from_profiler() -> bool:
    f = sys._getframe(2)
    for _ in range(8):
        if f is None:
            return False
        if f.f_code.co_filename.endswith(os.path.join("autograd", "profiler.py")):
            return True
        f = f.f_back
    return False


def _storage(t: torch.Tensor):
    return t.storage()._storage


def _extent(t: torch.Tensor) -> tuple[int, int] | None:
    """(byte offset, byte length) of a tensor view inside its storage, None if empty."""
    if t.numel() == 0:
        return None
    elem = t.element_size()
    span = 1 + sum((s - 1) * abs(d) for s, d in zip(t.shape, t.stride()))
    return t.storage_offset() * elem, span * elem


def _conv_backward_meta(grad_out, inp, weight, bias_sizes, stride, padding, dilation,
                        transposed, output_padding, groups, mask):
    """Shapes of aten::convolution_backward (torch 1.13 has no meta kernel for it)."""
    gi = torch.empty_like(inp, memory_format=torch.contiguous_format) if mask[0] else None
    gw = torch.empty_like(weight, memory_format=torch.contiguous_format) if mask[1] else None
    gb = None
    if mask[2]:
        n = bias_sizes[0] if bias_sizes else grad_out.shape[1]
        gb = torch.empty((n,), dtype=grad_out.dtype, device=grad_out.device)
    return gi, gw, gb


_META_FALLBACKS = {torch.ops.aten.convolution_backward.default: _conv_backward_meta}

_NUMBER = (bool, int, float, complex)


def _wrapped_number(value):
    """The tensor PyTorch makes of a Python scalar operand, holding `value`.

    That is a 0-dim CPU tensor flagged as a "wrapped number" (double for a
    float, int64 for an int, ...; in type promotion it counts as a scalar).
    torch 1.13 has no Python constructor for one, but autograd saves one for
    `t * value` (MulBackward keeps `other`): it is taken from there, with a
    pack hook of our own over any hooks in force (checkpoint's included).
    """
    got = []

    def pack(t):
        got.append(t)
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        torch.ones((), requires_grad=True) * value
    for t in got:
        if t.dim() == 0 and t.device.type == "cpu" and t.requires_grad is False:
            return t
    return torch.tensor(value)   # inference mode: an ordinary 0-dim tensor


def _numbers_as_tensors(func, args, kwargs):
    """`args`, `kwargs` with every Python number at a Tensor argument made a wrapped number.

    torch 1.13 hands a wrapped-number tensor to __torch_dispatch__ as a Python
    scalar, and torch.ops takes a scalar for a Tensor argument only for a few
    arithmetic ops (mul, add, ...): any other op on a wrapped number cannot be
    re-dispatched as it arrives.  Wrapped numbers reach such ops when autograd
    saved one (`x * 0.5` saves 0.5) and a saved-tensor hook works on it:
    checkpoint(use_reentrant=False) `detach()`es every tensor saved while it
    recomputes a region in backward.  None if there is no such number.
    """
    args, kwargs, changed = list(args), dict(kwargs), False
    for idx, a in enumerate(func._schema.arguments):
        t = a.type
        if isinstance(t, torch.OptionalType):
            t = t.getElementType()
        if not isinstance(t, torch.TensorType):
            continue
        if a.kwarg_only or idx >= len(args):
            if isinstance(kwargs.get(a.name), _NUMBER):
                kwargs[a.name] = _wrapped_number(kwargs[a.name])
                changed = True
        elif isinstance(args[idx], _NUMBER):
            args[idx] = _wrapped_number(args[idx])
            changed = True
    return (tuple(args), kwargs) if changed else None


class _Live:
    __slots__ = ("alloc", "nbytes", "ref")

    def __init__(self, alloc, nbytes, ref):
        self.alloc = alloc
        self.nbytes = nbytes
        self.ref = ref


class Recorder(TorchDispatchMode):
    """Sees every aten op; writes ALLOC / FREE / LAUNCH / COPY to a trace writer.

    `device` is the device whose storages are the job's GPU memory ('cpu' for a
    real run, 'meta' for a meta run).  Storages on other devices, and storages
    created on `device` by a factory op without an explicit device (which
    a GPU job would have placed on the host), are host memory: not traced.
    """

    def __init__(self, writer: st.Writer, device: str):
        super().__init__()
        self.w = writer
        self.device = torch.device(device)
        self.live: dict[int, _Live] = {}  # StorageImpl address -> live allocation
        self.next_alloc = 1
        self.h2d = False        # set while copying a batch "to the device"
        self.ops = 0
        self.launches = 0
        self.bytes_live = 0
        self.peak = 0

    # -- storages
    def _new(self, stor, site: int) -> _Live:
        nbytes = stor.nbytes()
        rec = _Live(self.next_alloc, nbytes, StorageWeakRef(stor))
        self.next_alloc += 1
        self.live[stor._cdata] = rec
        self.w.alloc(rec.alloc, nbytes, 0, site)
        self.bytes_live += nbytes
        self.peak = max(self.peak, self.bytes_live)
        return rec

    def track(self, t: torch.Tensor, site: str) -> None:
        """Registers an existing tensor's storage (parameters, buffers, state)."""
        if not isinstance(t, torch.Tensor) or t.device != self.device:
            return
        stor = _storage(t)
        if stor.nbytes() == 0 or stor._cdata in self.live:
            return
        self._new(stor, self.w.string(site))

    def _drop(self, key) -> None:
        rec = self.live.pop(key)
        self.w.free(rec.alloc, 0)
        self.bytes_live -= rec.nbytes

    def poll(self) -> None:
        """Emits FREE for every storage freed since the last poll (in allocation order)."""
        dead = [(rec.alloc, key) for key, rec in self.live.items() if rec.ref.expired()]
        for _, key in sorted(dead):
            self._drop(key)

    # -- ops
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.poll()
        try:
            try:
                out = func(*args, **kwargs)
            except RuntimeError:
                wrapped = _numbers_as_tensors(func, args, kwargs)
                if wrapped is None:
                    raise
                args, kwargs = wrapped   # host scalars: never traced, as before
                out = func(*args, **kwargs)
        except NotImplementedError:
            fallback = _META_FALLBACKS.get(func)
            if fallback is None or self.device.type != "meta":
                raise
            out = fallback(*args, **kwargs)
        self.ops += 1
        self._record(func, args, kwargs, out)
        return out

    def _record(self, func, args, kwargs, out) -> None:
        schema = func._schema
        name = schema.name.split("::")[-1]
        # inputs: tracked storages read (or written, by the schema's alias info)
        written_args = set()
        for i, a in enumerate(schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                written_args.add(a.name)
        touches: dict[int, list] = {}   # alloc -> [offset, end, mode]
        order: list[int] = []
        any_tracked_input = False

        def touch(rec, t, mode):
            ext = _extent(t)
            if ext is None:
                return
            off, length = ext
            end = min(off + length, rec.nbytes)
            cur = touches.get(rec.alloc)
            if cur is None:
                touches[rec.alloc] = [off, end, mode]
                order.append(rec.alloc)
            else:
                cur[0] = min(cur[0], off)
                cur[1] = max(cur[1], end)
                cur[2] |= mode

        inputs_seen = set()
        flat_in = []
        for idx, a in enumerate(schema.arguments):
            if a.kwarg_only:
                val = kwargs.get(a.name, None)
            else:
                val = args[idx] if idx < len(args) else kwargs.get(a.name, None)
            mode = st.READ_WRITE if a.name in written_args else st.READ
            for t in tree_flatten(val)[0]:
                if isinstance(t, torch.Tensor):
                    flat_in.append((t, mode))
        for t, mode in flat_in:
            if t.device != self.device:
                continue
            stor = _storage(t)
            rec = self.live.get(stor._cdata)
            if rec is None:
                continue
            any_tracked_input = True
            inputs_seen.add(stor._cdata)
            if rec.nbytes != stor.nbytes():      # resized in place (out= or resize_)
                self._resized(stor, rec, name)
                rec = self.live[stor._cdata]
            touch(rec, t, mode)

        # outputs
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        # a factory op (no tensor input) makes device memory, except the
        # profiler's record_function handle (torch.zeros(1) on the host)
        factory_on_device = not flat_in and not _called_from_profiler()
        new_allocs = []
        site = None
        for t in outs:
            if t.device != self.device:
                continue
            stor = _storage(t)
            key = stor._cdata
            rec = self.live.get(key)
            if rec is not None:
                if key not in inputs_seen and rec.nbytes != stor.nbytes():
                    self._resized(stor, rec, name)
                continue   # a view or an in-place/out= result: touched as an input
            if stor.nbytes() == 0:
                continue   # no allocation on a GPU for zero bytes
            if not (any_tracked_input or factory_on_device or self.h2d):
                continue   # host memory (e.g. torch.tensor(0.), an optimizer's step count)
            if site is None:
                site = self.w.string("aten::" + name)
            rec = self._new(stor, site)
            new_allocs.append(rec)
            touch(rec, t, st.WRITE)

        if self.h2d and new_allocs:
            for rec in new_allocs:
                self.w.copy(0, st.COPY_H2D, rec.nbytes, copy_duration_ns(rec.nbytes), (rec.alloc, 0), (0, 0))
            return
        if name in _ALLOC_ONLY or name in _NO_KERNEL or not touches or _is_view(func):
            return
        if name == "_local_scalar_dense":     # .item(): a device-to-host copy
            a = order[0]
            off, end, _ = touches[a]
            self.w.copy(0, st.COPY_D2H, end - off, copy_duration_ns(end - off), (0, 0), (a, off))
            return
        if name == "copy_" and len(touches) == 1 and len(flat_in) >= 2:
            # one side is not traced: host memory, so this is a PCIe copy
            (a,) = order
            off, end, _ = touches[a]
            if self._tracked(flat_in[0][0]):
                self.w.copy(0, st.COPY_H2D, end - off, copy_duration_ns(end - off), (a, off), (0, 0))
            else:
                self.w.copy(0, st.COPY_D2H, end - off, copy_duration_ns(end - off), (0, 0), (a, off))
            return
        nbytes = 0
        tl = []
        for a in order:
            off, end, mode = touches[a]
            length = end - off
            nbytes += length * (2 if mode == st.READ_WRITE else 1)
            tl.append((a, off, length, mode))
        dtype = outs[0].dtype if outs else flat_in[0][0].dtype
        self.w.launch(0, self.w.string("aten::" + name), op_duration_ns(name, args, outs, nbytes, dtype), tl)
        self.launches += 1

    def _tracked(self, t: torch.Tensor) -> bool:
        return t.device == self.device and _storage(t)._cdata in self.live

    def _resized(self, stor, rec, name) -> None:
        """A storage whose size changed in place: on a GPU, a new block and a free of the old."""
        key = stor._cdata
        old = self.live.pop(key)
        self.bytes_live -= old.nbytes
        if stor.nbytes() > 0:
            self._new(stor, self.w.string("aten::" + name))
        self.w.free(old.alloc, 0)


# ------------------------------------------------------------------ training loop

def load_model_file(path: str, overrides: dict | None = None) -> dict:
    spec = importlib.util.spec_from_file_location(
        "spillway_model_" + os.path.splitext(os.path.basename(path))[0], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    job = mod.build(**(overrides or {}))
    for key in ("model", "batches", "loss_fn"):
        if key not in job:
            raise SystemExit(f"{path}: build() must return a dict with '{key}'")
    job.setdefault("name", os.path.splitext(os.path.basename(path))[0])
    return job


def _to_meta(x):
    return tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, x)


def record(job: dict, out_path: str, steps: int | None = None, meta_mode: bool = False,
           extra_meta: dict | None = None, progress=None) -> dict:
    """Runs `steps` training steps of `job` under the recorder; returns a summary."""
    model = job["model"]
    batches = list(job["batches"])
    loss_fn = job["loss_fn"]
    optimizer = job.get("optimizer")
    if meta_mode:
        model = model.to("meta")
        batches = [_to_meta(b) for b in batches]
        if optimizer is not None:   # rebuild it over the moved parameters
            optimizer = type(optimizer)(model.parameters(), **optimizer.defaults)
    params = list(model.parameters())
    device = params[0].device if params else torch.device("cpu")
    if optimizer is None:
        optimizer = torch.optim.AdamW(model.parameters())
    steps = len(batches) if steps is None else steps
    dtype = params[0].dtype if params else torch.float32
    meta = {
        "source": "recorder",
        "model": job.get("name", "model"),
        "dtype": str(dtype).replace("torch.", ""),
        "steps": steps,
        "device": "meta (no compute)" if device.type == "meta" else "cpu",
        "torch": torch.__version__,
        "optimizer": type(optimizer).__name__,
        "cost_model": COST_MODEL,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    meta.update(job.get("meta", {}))
    meta.update(extra_meta or {})
    t0 = time.monotonic()
    step_peaks = []
    gc_was = gc.isenabled()
    gc.disable()   # frees happen when references drop, not when the collector runs
    try:
        with st.Writer(out_path, meta) as w:
            rec = Recorder(w, device.type)
            for name, p in model.named_parameters():
                rec.track(p, "parameter")
            for name, b in model.named_buffers():
                rec.track(b, "buffer")
            for s in range(steps):
                x, y = batches[s % len(batches)]
                rec.poll()
                w.step(s)
                base = rec.bytes_live
                rec.peak = base
                with rec:
                    w.phase(st.PHASE_OTHER)
                    rec.h2d = True
                    try:
                        x = tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, x)
                        y = tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, y)
                    finally:
                        rec.h2d = False
                    rec.poll()
                    w.phase(st.PHASE_FORWARD)
                    out = model(x)
                    loss = loss_fn(out, y)
                    rec.poll()
                    w.phase(st.PHASE_BACKWARD)
                    loss.backward()
                    rec.poll()
                    w.phase(st.PHASE_OPTIMIZER)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    rec.poll()
                    w.phase(st.PHASE_OTHER)
                    del out
                    rec.poll()
                    del loss
                    rec.poll()
                    del x, y
                    rec.poll()
                step_peaks.append(rec.peak)
                if progress:
                    progress(f"step {s}: peak {rec.peak / 2**20:.1f} MiB, {rec.launches} launches, "
                             f"{time.monotonic() - t0:.1f} s")
            rec.poll()
            summary = {"steps": steps, "ops": rec.ops, "launches": rec.launches,
                       "allocs": rec.next_alloc - 1, "step_peak_bytes": step_peaks,
                       "records": w.records + 1}
    finally:
        if gc_was:
            gc.enable()
    summary["seconds"] = time.monotonic() - t0
    summary["bytes"] = os.path.getsize(out_path)
    return summary


def _parse_set(items):
    out = {}
    for item in items or []:
        key, _, val = item.partition("=")
        for conv in (int, float):
            try:
                val = conv(val)
                break
            except ValueError:
                continue
        else:
            if val in ("true", "false"):
                val = val == "true"
        out[key] = val
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a .py file defining build()")
    ap.add_argument("--out", required=True, help="trace to write (.spwt)")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default: one per batch)")
    ap.add_argument("--meta", action="store_true", help="move the model to the meta device (no compute)")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE", help="keyword argument for build()")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    overrides = _parse_set(a.set)
    t0 = time.monotonic()
    job = load_model_file(a.model, overrides)
    build_s = time.monotonic() - t0
    say = None if a.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    extra = {"build_args": overrides} if overrides else {}
    summary = record(job, a.out, a.steps, a.meta, extra, say)
    peaks = ", ".join(f"{p / 2**20:.1f}" for p in summary["step_peak_bytes"])
    print(f"{a.out}: {summary['steps']} steps, {summary['ops']} ops, {summary['launches']} launches, "
          f"{summary['allocs']} allocations, {summary['bytes']} bytes; step peaks (MiB): {peaks}; "
          f"build {build_s:.1f} s, record {summary['seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
