#!/usr/bin/env python3
"""Checks, on a real GPU, the assumptions spillway's design rests on (docs/gpu.md).

    python3 harness/gpu/check_assumptions.py [--checks a,b,c,d,e,f,g,h] [--device 0] [--json out.json]

  a  VMM host memory: host-NUMA cuMemCreate, map into a device range, kernel and
     copy access through it, remap the same address device -> host -> device
  b  CUPTI launch callbacks for runtime launches (driver nested in runtime? ids?)
  c  cuMemUnmap while work on the range is pending
  d  pinned and host-NUMA VMM copy bandwidth, each way and both at once
  e  what each VMM call costs, by size, for device and host-NUMA memory
  f  host-NUMA creation on 1-8 threads; small driver calls on one thread while another creates
  g  device memory as granule handles side by side: one cuMemSetAccess / cuMemUnmap over several
     mappings? data follows its handle? what mapping k granules costs against one handle of k
  h  device VMM calls on several threads: do they run at once, and do they slow another thread's
     launches, copies and VMM calls?

Each check prints PASS / FAIL / SKIP, what it measured, and what spillway does
if it fails. Each runs in its own child process (check c may leave its CUDA
context unusable on purpose). Exit status: 0 when nothing failed, 1 when a
check failed, 2 when there is no GPU (no libcuda.so.1, cuInit fails, or no
device). Uses the CUDA driver (libcuda.so.1) and CUPTI through ctypes, and
torch for check b only; never run in CI (no GPU there).
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_ctypes as cu  # noqa: E402
from cuda_ctypes import CUDA_SUCCESS, CudaError  # noqa: E402

# docs/sim.md: the simulator's defaults (SIMCUDA_H2D_GBPS / SIMCUDA_D2H_GBPS, SIMCUDA_BIDIR_GBPS)
SIM_GBPS_PER_DIRECTION = 55.0
SIM_GBPS_BIDIR = 45.0

CHECKS = {
    "a": "VMM host memory (host-NUMA) mapped at a device address, remapped in place",
    "b": "CUPTI launch callbacks for runtime (torch) launches",
    "c": "cuMemUnmap of a range with pending work",
    "d": "copy bandwidth each way and both at once (pinned, and host-NUMA VMM)",
    "e": "what each VMM call spillway makes costs, by size (device and host-NUMA memory)",
    "f": "host-NUMA creation on several threads, and its cost to another thread's driver calls",
    "g": "device memory as granule handles mapped side by side (one access grant and one unmap over "
         "several mappings), and what that costs against one handle",
    "h": "device VMM calls on several threads at once, and their cost to another thread's calls",
}

IF_FAILS = {
    "a": "spillway's evictions create host memory with cuMemCreate(HOST_NUMA) and map it at the "
         "block's address; if that is refused, each eviction is rolled back (`evictions_failed` in "
         "the stats), the block stays on the GPU, and an allocation over the budget returns NULL "
         "(PyTorch's OOM). Use SPILLWAY_MODE=off on this machine; `managed` mode (design.md 4.2), "
         "the planned fallback, is not implemented. If data was not intact after a remap, spillway "
         "cannot be used safely here: report it.",
    "b": "spillway scans launch arguments in these callbacks; a torch launch seen by neither the "
         "runtime nor the driver callback is not scanned: an evicted block it reads is read over "
         "the link (slow, correct), and its stream is not recorded as a user of the block "
         "(docs/limitations.md, blind mode). Report it.",
    "c": "spillway waits on an event of every stream that may use a range before cuMemUnmap "
         "(design.md 4.1). If unmapping after that wait fails or loses data, evictions are unsafe "
         "on this driver: use SPILLWAY_MODE=off and report it.",
    "d": "spillway stays correct at any bandwidth; slower copies make evictions and restores cost "
         "more step time. Without overlap of the two directions, evictions and restores serialize "
         "on the link; a host-NUMA VMM path much slower than pinned copies makes spillway's copies "
         "slower than the simulator assumes. Set SIMCUDA_H2D_GBPS/SIMCUDA_D2H_GBPS/"
         "SIMCUDA_BIDIR_GBPS to the measured values to replay traces with this machine's link.",
    "e": "spillway stays correct whatever the calls cost; each eviction and restore makes about "
         "five of them (and a first eviction of a size creates its host memory), so their cost is "
         "step time the simulator does not charge unless SIMCUDA_VMM_NS / SIMCUDA_CALL_NS say so.",
    "f": "spillway stays correct whatever these figures are. A failure means host-NUMA memory could "
         "not be created or released in pieces on several threads at once, or a small call failed "
         "beside it: spillway's reserve thread creates pieces while the job's thread runs, and an "
         "eviction whose host memory cannot be created is rolled back (`evictions_failed`). "
         "Report the error.",
    "g": "nothing spillway does today depends on it: spillway maps one handle per block. A failure "
         "(granules not mappable side by side, or data not following its handle) rules out backing "
         "blocks by a pool of fixed-size handles (docs/residency.md, session 16): report it.",
    "h": "spillway stays correct whatever these figures are; a failure means a device VMM call "
         "failed while another thread made them too, which spillway's mover and the job's thread "
         "do: report the error.",
}

RESULT_TAG = "SPILLWAY-CHECK-RESULT "


class Skip(Exception):
    pass


# ----------------------------------------------------------------------------
# helpers running in a child
# ----------------------------------------------------------------------------
class Gpu:
    """The driver, the device's primary context made current, and a few conveniences."""

    def __init__(self, lib, ordinal):
        self.d = cu.Driver(lib)
        self.d.check("cuInit", 0)
        dev = ctypes.c_int()
        self.d.check("cuDeviceGet", ctypes.byref(dev), ordinal)
        self.dev = dev.value
        ctx = ctypes.c_void_p()
        self.d.check("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), self.dev)
        self.d.check("cuCtxSetCurrent", ctx)
        self.ctx = ctx
        self._module = None
        self._module_error = None

    def attr(self, a):
        return self.d.attribute(a, self.dev)[0]

    def prop(self, loc_type, loc_id):
        p = cu.CUmemAllocationProp()
        p.type = cu.CU_MEM_ALLOCATION_TYPE_PINNED
        p.requestedHandleTypes = cu.CU_MEM_HANDLE_TYPE_NONE  # cuda.h: must be 0 for HOST locations
        p.location.type = loc_type
        p.location.id = loc_id
        return p

    def granularity(self, prop):
        g = ctypes.c_size_t()
        self.d.check("cuMemGetAllocationGranularity", ctypes.byref(g), ctypes.byref(prop),
                     cu.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        return g.value

    def reserve(self, size, align):
        va = cu.CUdeviceptr()
        self.d.check("cuMemAddressReserve", ctypes.byref(va), size, align, 0, 0)
        return va.value

    def create(self, size, prop):
        """Returns (handle or None, CUresult, seconds)."""
        h = ctypes.c_uint64()
        t = time.perf_counter()
        r = self.d.call("cuMemCreate", ctypes.byref(h), size, ctypes.byref(prop), 0)
        return (h.value if r == CUDA_SUCCESS else None), r, time.perf_counter() - t

    def map_rw(self, va, size, handle):
        self.d.check("cuMemMap", va, size, 0, handle, 0)
        desc = cu.CUmemAccessDesc()
        desc.location.type = cu.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = self.dev
        desc.flags = cu.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self.d.check("cuMemSetAccess", va, size, ctypes.byref(desc), 1)

    def stream(self):
        s = ctypes.c_void_p()
        self.d.check("cuStreamCreate", ctypes.byref(s), cu.CU_STREAM_NON_BLOCKING)
        return s

    def event(self):
        e = ctypes.c_void_p()
        self.d.check("cuEventCreate", ctypes.byref(e), cu.CU_EVENT_DEFAULT)
        return e

    def elapsed_ms(self, a, b):
        ms = ctypes.c_float()
        self.d.check("cuEventElapsedTime", ctypes.byref(ms), a, b)
        return ms.value

    def kernels(self):
        """(spw_add_u32, spw_spin_add_u32) CUfunctions from the PTX in kernels.py, or None."""
        if self._module is None and self._module_error is None:
            try:
                from kernels import PTX
                mod = ctypes.c_void_p()
                image = ctypes.create_string_buffer(PTX.encode())
                self.d.check("cuModuleLoadData", ctypes.byref(mod), image)
                fns = []
                for name in (b"spw_add_u32", b"spw_spin_add_u32"):
                    f = ctypes.c_void_p()
                    self.d.check("cuModuleGetFunction", ctypes.byref(f), mod, name)
                    fns.append(f)
                self._module = tuple(fns)
            except (CudaError, AttributeError) as e:
                self._module_error = str(e)
        return self._module

    def launch(self, f, stream, *params):
        """params: ctypes values, in the kernel's order."""
        arr = (ctypes.c_void_p * len(params))(*[ctypes.cast(ctypes.pointer(p), ctypes.c_void_p)
                                               for p in params])
        self.d.check("cuLaunchKernel", f, 256, 1, 1, 256, 1, 1, 0, stream, arr, None)

    def read(self, va, size):
        buf = ctypes.create_string_buffer(size)
        self.d.check("cuMemcpyDtoH", buf, va, size)
        return buf.raw

    def write(self, va, data):
        buf = ctypes.create_string_buffer(data, len(data))
        self.d.check("cuMemcpyHtoD", va, buf, len(data))


def pattern(n_words, salt):
    import array
    return array.array("I", ((i * 2654435761 + salt) & 0xFFFFFFFF for i in range(n_words))).tobytes()


def plus(data, k):
    import array
    a = array.array("I")
    a.frombytes(data)
    return array.array("I", ((x + k) & 0xFFFFFFFF for x in a)).tobytes()


def emit(result):
    sys.stdout.write(RESULT_TAG + json.dumps(result) + "\n")
    sys.stdout.flush()


# ----------------------------------------------------------------------------
# a: VMM host memory
# ----------------------------------------------------------------------------
def check_a(gpu, args):
    d, m = gpu.d, {}
    vmm = gpu.attr(cu.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
    numa_vmm, r_attr = d.attribute(cu.CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, gpu.dev)
    numa_id = gpu.attr(cu.CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID)
    m.update(vmm_supported=vmm, host_numa_vmm_supported=numa_vmm, host_numa_id=numa_id)
    if numa_vmm is None:
        m["host_numa_vmm_attribute_error"] = d.error_name(r_attr)
    notes = []
    if numa_id not in (None, 0):
        notes.append(f"the GPU's host NUMA node is {numa_id}; spillway currently creates host memory "
                     "on node 0 (shim/src/host_backing.cpp): evictions may cross sockets (report this)")
    if not vmm:
        return "FAIL", m, notes + ["VMM unsupported: spillway cannot serve allocations here"]
    numa = numa_id if numa_id is not None and numa_id >= 0 else 0
    dprop = gpu.prop(cu.CU_MEM_LOCATION_TYPE_DEVICE, gpu.dev)
    hprop = gpu.prop(cu.CU_MEM_LOCATION_TYPE_HOST_NUMA, numa)
    gd = gpu.granularity(dprop)
    try:
        gh = gpu.granularity(hprop)
    except CudaError as e:
        m["host_granularity_error"] = e.name
        return "FAIL", m, notes + ["cuMemGetAllocationGranularity refuses a HOST_NUMA location"]
    m.update(device_granularity=gd, host_granularity=gh)
    g = max(gd, gh)
    size = 2 * g
    words = size // 4
    va = gpu.reserve(size, g)
    scratch = gpu.reserve(size, g)
    stage = gpu.reserve(size, g)
    steps = []
    ok = True
    fns = gpu.kernels()
    m["kernel"] = "PTX spw_add_u32" if fns else f"none ({gpu._module_error}); copies and memsets only"

    def touch(label, expect):
        """Access through the mapping with a kernel (if any) and copies; returns the new contents."""
        nonlocal ok
        if fns:
            gpu.launch(fns[0], None, ctypes.c_uint64(va), ctypes.c_uint64(words), ctypes.c_uint32(1))
            d.check("cuCtxSynchronize")
            expect = plus(expect, 1)
        # memset and device-to-device copies through the mapping: the copy engines' access
        tail = va + size - g
        d.check("cuMemcpyDtoD", tmp_save, tail, g)   # save the tail
        d.check("cuMemsetD8", tail, 0xAB, g)
        memset_ok = gpu.read(tail, g) == bytes([0xAB]) * g
        d.check("cuMemcpyDtoD", tail, tmp_save, g)   # put it back
        got = gpu.read(va, size)
        good = got == expect and memset_ok
        steps.append(f"{label}: {'intact' if good else 'DATA MISMATCH'}")
        ok = ok and good
        return expect

    # a plain device allocation for memset/copy round trips
    tmp = cu.CUdeviceptr()
    d.check("cuMemAlloc", ctypes.byref(tmp), g)
    tmp_save = tmp.value

    hdev, r, _ = gpu.create(size, dprop)
    if hdev is None:
        return "FAIL", m, notes + [f"cuMemCreate(DEVICE) returned {d.error_name(r)}"]
    gpu.map_rw(va, size, hdev)
    data = pattern(words, 7)
    gpu.write(va, data)
    data = touch("device memory", data)

    # evict, as spillway does: copy into host memory mapped at a staging address of
    # its own (which stays mapped while spillway holds the memory: vmm.h, staged
    # pool), then swap: the host memory is mapped at two addresses at once
    hhost, r, t_create = gpu.create(size, hprop)
    m["host_create_result"] = d.error_name(r)
    m["host_create_ms"] = round(t_create * 1e3, 3)
    if hhost is None:
        return "FAIL", m, notes + [f"cuMemCreate(HOST_NUMA id {numa}) returned {d.error_name(r)}"]
    gpu.map_rw(stage, size, hhost)
    d.check("cuMemcpyDtoD", stage, va, size)
    d.check("cuCtxSynchronize")
    t = time.perf_counter()
    d.check("cuMemUnmap", va, size)
    gpu.map_rw(va, size, hhost)
    m["swap_to_host_ms"] = round((time.perf_counter() - t) * 1e3, 3)
    d.check("cuMemRelease", hdev)
    data = touch("host memory at the same address", data)
    staged_ok = gpu.read(stage, size) == data
    steps.append(f"the same host memory through its staging address: {'intact' if staged_ok else 'DATA MISMATCH'}")
    ok = ok and staged_ok

    # restore: new device memory at the scratch address, copy, swap back
    hdev2, r, t_dev = gpu.create(size, dprop)
    m["device_create_ms"] = round(t_dev * 1e3, 3)
    if hdev2 is None:
        return "FAIL", m, notes + [f"cuMemCreate(DEVICE) for the restore returned {d.error_name(r)}"]
    gpu.map_rw(scratch, size, hdev2)
    d.check("cuMemcpyDtoD", scratch, va, size)
    d.check("cuCtxSynchronize")
    t = time.perf_counter()
    d.check("cuMemUnmap", scratch, size)
    d.check("cuMemUnmap", va, size)
    gpu.map_rw(va, size, hdev2)
    m["swap_to_device_ms"] = round((time.perf_counter() - t) * 1e3, 3)
    d.check("cuMemUnmap", stage, size)
    d.check("cuMemRelease", hhost)
    touch("device memory again", data)
    d.check("cuMemUnmap", va, size)
    d.check("cuMemRelease", hdev2)
    d.check("cuMemAddressFree", va, size)
    d.check("cuMemAddressFree", scratch, size)
    d.check("cuMemAddressFree", stage, size)
    d.check("cuMemFree", tmp.value)
    m["steps"] = steps
    if not numa_vmm:
        notes.append("the attribute says unsupported but the calls worked")
    return ("PASS" if ok and numa_vmm else "FAIL"), m, notes


# ----------------------------------------------------------------------------
# b: CUPTI callbacks
# ----------------------------------------------------------------------------
def check_b(gpu, args):
    try:
        import torch
    except ImportError:
        raise Skip("torch is not importable (check b launches torch kernels)")
    if not torch.cuda.is_available():
        raise Skip("torch has no usable CUDA")
    dev = torch.device("cuda", args.device)
    x = torch.randn(1 << 20, device=dev)
    a = torch.randn(512, 512, device=dev)
    torch.cuda.synchronize(dev)
    lib, path, tried = cu.find_cupti(args.cupti_lib)
    if lib is None:
        raise Skip("no CUPTI library found (" + "; ".join(tried[-3:]) + "); pass --cupti-lib")
    m = {"cupti": path}
    if hasattr(lib, "cuptiGetVersion"):
        v = ctypes.c_uint32()
        lib.cuptiGetVersion.argtypes = [ctypes.POINTER(ctypes.c_uint32)]
        if lib.cuptiGetVersion(ctypes.byref(v)) == 0:
            m["cupti_api_version"] = v.value
    local = threading.local()
    events = []  # (phase, domain, cbid, corr, nested_in_runtime_corr, stream)
    phase = ["setup"]

    def callback(userdata, domain, cbid, cbdata):
        try:
            cb = cu.CUpti_CallbackData.from_address(cbdata)
            stack = getattr(local, "stack", None)
            if stack is None:
                stack = local.stack = []
            if domain == cu.CUPTI_CB_DOMAIN_RUNTIME_API:
                if cb.callbackSite == cu.CUPTI_API_ENTER:
                    stream = None
                    if cbid in cu.RUNTIME_CBIDS_WITH_LAUNCH_PARAMS and cb.functionParams:
                        stream = cu.cudaLaunchKernel_v7000_params.from_address(cb.functionParams).stream
                    stack.append(cb.correlationId)
                    events.append((phase[0], "runtime", cbid, cb.correlationId, None, stream))
                elif stack:
                    stack.pop()
            elif domain == cu.CUPTI_CB_DOMAIN_DRIVER_API and cb.callbackSite == cu.CUPTI_API_ENTER:
                stream = None
                if cbid in cu.DRIVER_CBIDS_WITH_LAUNCH_PARAMS and cb.functionParams:
                    stream = cu.cuLaunchKernel_params.from_address(cb.functionParams).hStream
                events.append((phase[0], "driver", cbid, cb.correlationId,
                               stack[-1] if stack else None, stream))
        except Exception as e:  # never raise into CUPTI
            events.append((phase[0], "error", 0, 0, None, str(e)))

    cfunc = cu.CUpti_CallbackFunc(callback)
    lib.cuptiSubscribe.argtypes = [ctypes.POINTER(ctypes.c_void_p), cu.CUpti_CallbackFunc, ctypes.c_void_p]
    lib.cuptiEnableCallback.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.cuptiUnsubscribe.argtypes = [ctypes.c_void_p]
    sub = ctypes.c_void_p()
    r = lib.cuptiSubscribe(ctypes.byref(sub), cfunc, None)
    if r == cu.CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
        raise Skip("another CUPTI subscriber is active (a profiler?): spillway would run blind too")
    if r != cu.CUPTI_SUCCESS:
        raise Skip(f"cuptiSubscribe returned CUptiResult {r}")
    refused = []
    for domain, table in ((cu.CUPTI_CB_DOMAIN_DRIVER_API, cu.DRIVER_LAUNCH_CBIDS),
                          (cu.CUPTI_CB_DOMAIN_RUNTIME_API, cu.RUNTIME_LAUNCH_CBIDS)):
        for cbid, name in table.items():
            if lib.cuptiEnableCallback(1, sub, domain, cbid) != cu.CUPTI_SUCCESS:
                refused.append(name)  # an older CUPTI lacks the CUDA 13 ids
    m["callbacks_not_enabled"] = refused
    ops = {
        "elementwise (x + 1)": lambda: x + 1,
        "reduction (x.sum())": lambda: x.sum(),
        "matmul (cuBLAS)": lambda: a @ a,
        "softmax": lambda: torch.softmax(a, dim=1),
    }
    try:
        for label, op in ops.items():
            phase[0] = label
            op()
            torch.cuda.synchronize(dev)
        phase[0] = "done"
    finally:
        lib.cuptiUnsubscribe(sub)
    per = {}
    failed = []
    nested_same = nested_diff = 0
    for label in ops:
        ev = [e for e in events if e[0] == label]
        rt = [e for e in ev if e[1] == "runtime"]
        dr = [e for e in ev if e[1] == "driver"]
        nested = [e for e in dr if e[4] is not None]
        rt_with_nested = {e[4] for e in nested}
        nested_same += sum(1 for e in nested if e[3] == e[4])
        nested_diff += sum(1 for e in nested if e[3] != e[4])
        per[label] = {
            "runtime_launch_callbacks": len(rt),
            "driver_launch_callbacks": len(dr),
            "driver_nested_in_runtime": len(nested),
            "runtime_without_nested_driver": sum(1 for e in rt if e[3] not in rt_with_nested),
            "driver_not_nested": len(dr) - len(nested),
            "names": sorted({(cu.RUNTIME_LAUNCH_CBIDS if e[1] == "runtime" else cu.DRIVER_LAUNCH_CBIDS)
                             .get(e[2], str(e[2])) for e in rt + dr}),
        }
        if not rt and not dr:
            failed.append(label)
    errors = [e[5] for e in events if e[1] == "error"]
    m["per_op"] = per
    m["nested_pairs_same_correlation_id"] = nested_same
    m["nested_pairs_different_correlation_id"] = nested_diff
    notes = []
    if errors:
        notes.append("callback errors: " + "; ".join(errors[:3]))
    if nested_diff:
        notes.append("runtime and nested driver callbacks carry different correlation ids: "
                     "spillway's de-duplication by nesting (not by id) is the right one")
    if nested_same:
        notes.append("some nested pairs share a correlation id")
    if any(p["runtime_without_nested_driver"] for p in per.values()):
        notes.append("some runtime launches fired no nested driver callback: spillway does not scan "
                     "those (it counts them and warns once, docs/limitations.md); report this")
    if failed:
        notes.append("no launch callback at all for: " + ", ".join(failed))
    return ("FAIL" if failed or errors else "PASS"), m, notes


# ----------------------------------------------------------------------------
# c: unmap with pending work
# ----------------------------------------------------------------------------
def check_c(gpu, args):
    d, m, notes = gpu.d, {}, []
    dprop = gpu.prop(cu.CU_MEM_LOCATION_TYPE_DEVICE, gpu.dev)
    g = gpu.granularity(dprop)
    size = 2 * g
    words = size // 4
    va = gpu.reserve(size, g)
    h, r, _ = gpu.create(size, dprop)
    if h is None:
        raise Skip(f"cuMemCreate(DEVICE) returned {d.error_name(r)}")
    gpu.map_rw(va, size, h)
    data = pattern(words, 11)
    gpu.write(va, data)
    s = gpu.stream()
    e0, e1 = gpu.event(), gpu.event()
    fns = gpu.kernels()
    khz = gpu.attr(cu.CU_DEVICE_ATTRIBUTE_CLOCK_RATE) or 1500000
    target_ms = args.pending_ms

    def queue_work():
        """Work on `s` that uses the whole range for about target_ms; returns the expected increment."""
        if fns:
            cycles = int(khz * target_ms)  # kHz * ms = cycles
            gpu.launch(fns[1], s, ctypes.c_uint64(va), ctypes.c_uint64(words), ctypes.c_uint64(cycles))
            return 1
        for _ in range(args.memset_chain):  # no kernel: a chain of memsets over the range
            d.check("cuMemsetD8Async", va, 0x5A, size, s)
        return None

    m["pending_work"] = (f"PTX spin kernel (~{target_ms} ms at {khz} kHz)" if fns
                         else f"{args.memset_chain} cuMemsetD8Async over the range ({gpu._module_error})")
    # 1. What spillway does: wait for the work's event, then unmap.
    d.check("cuEventRecord", e0, s)
    inc = queue_work()
    d.check("cuEventRecord", e1, s)
    d.check("cuEventSynchronize", e1)
    m["pending_work_ms"] = round(gpu.elapsed_ms(e0, e1), 3)
    t = time.perf_counter()
    r = d.call("cuMemUnmap", va, size)
    m["unmap_after_event_wait"] = d.error_name(r)
    m["unmap_after_event_wait_ms"] = round((time.perf_counter() - t) * 1e3, 3)
    safe_ok = r == CUDA_SUCCESS
    if safe_ok:
        gpu.map_rw(va, size, h)
        got = gpu.read(va, size)
        expect = plus(data, inc) if inc else bytes([0x5A]) * size
        m["data_after_wait_and_remap"] = "intact" if got == expect else "MISMATCH"
        safe_ok = got == expect
        data = got
    emit({"check": "c", "partial": True, "status": "PASS" if safe_ok else "FAIL", "measured": m,
          "notes": notes})
    if not safe_ok or args.no_unsafe:
        if args.no_unsafe:
            m["unmap_with_pending_work"] = "not tried (--no-unsafe)"
        return ("PASS" if safe_ok else "FAIL"), m, notes
    # 2. The experiment: unmap while the work is still running.
    d.check("cuEventRecord", e0, s)
    queue_work()
    d.check("cuEventRecord", e1, s)
    q_before = d.call("cuEventQuery", e1)
    t = time.perf_counter()
    r = d.call("cuMemUnmap", va, size)
    dt = time.perf_counter() - t
    q_after = d.call("cuEventQuery", e1)
    r_sync = d.call("cuStreamSynchronize", s)
    m.update(unmap_with_pending_work=d.error_name(r), unmap_call_ms=round(dt * 1e3, 3),
             work_done_before_unmap=q_before == CUDA_SUCCESS,
             work_done_when_unmap_returned=q_after == CUDA_SUCCESS,
             stream_result_afterwards=d.error_name(r_sync))
    if q_before == CUDA_SUCCESS:
        verdict = "inconclusive: the work finished before cuMemUnmap was called (raise --pending-ms)"
    elif r != CUDA_SUCCESS:
        verdict = f"the driver refuses it ({d.error_name(r)})"
    elif q_after == CUDA_SUCCESS:
        verdict = f"the driver waited for the work ({dt * 1e3:.1f} ms in cuMemUnmap)"
    else:
        verdict = ("cuMemUnmap returned before the work finished; the work then ended with "
                   f"{d.error_name(r_sync)}")
    m["verdict"] = verdict
    notes.append("unmap with pending work: " + verdict + ". spillway never relies on it: it waits first")
    return "PASS", m, notes


# ----------------------------------------------------------------------------
# d: bandwidth
# ----------------------------------------------------------------------------
def check_d(gpu, args):
    d, m, notes = gpu.d, {}, []
    size, reps = args.bw_mib << 20, args.bw_reps
    s1, s2 = gpu.stream(), gpu.stream()
    ev = [gpu.event() for _ in range(4)]

    def measure(h2d, d2h):
        """h2d/d2h(stream) enqueue one copy each way; returns GB/s (h2d, d2h, both_h2d, both_d2h, aggregate)."""
        h2d(s1), d2h(s2)
        d.check("cuCtxSynchronize")
        out = []
        for fn, st in ((h2d, s1), (d2h, s2)):
            d.check("cuEventRecord", ev[0], st)
            for _ in range(reps):
                fn(st)
            d.check("cuEventRecord", ev[1], st)
            d.check("cuEventSynchronize", ev[1])
            out.append(size * reps / (gpu.elapsed_ms(ev[0], ev[1]) * 1e6))
        d.check("cuEventRecord", ev[0], s1)
        d.check("cuEventRecord", ev[2], s2)
        for _ in range(reps):
            h2d(s1)
            d2h(s2)
        d.check("cuEventRecord", ev[1], s1)
        d.check("cuEventRecord", ev[3], s2)
        d.check("cuCtxSynchronize")
        t_h = gpu.elapsed_ms(ev[0], ev[1])
        t_d = gpu.elapsed_ms(ev[2], ev[3])
        start = min(0.0, gpu.elapsed_ms(ev[0], ev[2]))
        end = max(t_h, gpu.elapsed_ms(ev[0], ev[3]))
        out += [size * reps / (t_h * 1e6), size * reps / (t_d * 1e6), 2 * size * reps / ((end - start) * 1e6)]
        return [round(x, 2) for x in out]

    def summarize(key, v):
        m[key] = dict(zip(("h2d_GBps", "d2h_GBps", "both_h2d_GBps", "both_d2h_GBps", "both_aggregate_GBps"), v))
        return v

    # pinned host memory <-> cuMemAlloc'd device memory
    hp = [ctypes.c_void_p(), ctypes.c_void_p()]
    dp = [cu.CUdeviceptr(), cu.CUdeviceptr()]
    for i in range(2):
        d.check("cuMemHostAlloc", ctypes.byref(hp[i]), size, cu.CU_MEMHOSTALLOC_PORTABLE)
        d.check("cuMemAlloc", ctypes.byref(dp[i]), size)
        d.check("cuMemsetD8", dp[i].value, i + 1, size)
    pinned = summarize("pinned", measure(
        lambda st: d.check("cuMemcpyHtoDAsync", dp[0].value, hp[0], size, st),
        lambda st: d.check("cuMemcpyDtoHAsync", hp[1], dp[1].value, size, st)))
    # spillway's own path: cuMemcpyDtoDAsync between device VMM memory and host-NUMA VMM memory
    numa = gpu.attr(cu.CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID)
    numa = numa if numa is not None and numa >= 0 else 0
    dprop = gpu.prop(cu.CU_MEM_LOCATION_TYPE_DEVICE, gpu.dev)
    hprop = gpu.prop(cu.CU_MEM_LOCATION_TYPE_HOST_NUMA, numa)
    vmm = None
    try:
        g = max(gpu.granularity(dprop), gpu.granularity(hprop))
        vsize = -(-size // g) * g
        ranges = []
        for prop in (dprop, dprop, hprop, hprop):
            va = gpu.reserve(vsize, g)
            h, r, _ = gpu.create(vsize, prop)
            if h is None:
                raise CudaError("cuMemCreate", r, d.error_name(r))
            gpu.map_rw(va, vsize, h)
            ranges.append(va)
        dev0, dev1, host0, host1 = ranges
        vmm = summarize("host_numa_vmm", measure(
            lambda st: d.check("cuMemcpyDtoDAsync", dev0, host0, size, st),   # restore: host -> device
            lambda st: d.check("cuMemcpyDtoDAsync", host1, dev1, size, st)))  # evict: device -> host
    except CudaError as e:
        m["host_numa_vmm"] = f"not measured: {e}"
    m["async_engines"] = gpu.attr(cu.CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT)
    m["sim_defaults_GBps"] = {"per_direction": SIM_GBPS_PER_DIRECTION, "each_way_when_both": SIM_GBPS_BIDIR}
    ok = True
    for label, v in (("pinned", pinned), ("host-NUMA VMM", vmm)):
        if v is None:
            continue
        overlap = v[4] / max(v[0], v[1])
        m.setdefault("overlap_factor", {})[label] = round(overlap, 2)
        if overlap < 1.2:
            ok = False
            notes.append(f"{label}: both directions at once move {v[4]} GB/s, not more than one "
                         "direction alone: the copies do not overlap")
    if vmm is not None:
        for i, name in ((0, "host->device"), (1, "device->host")):
            if vmm[i] < 0.5 * pinned[i]:
                ok = False
                notes.append(f"host-NUMA VMM {name} copies run at {vmm[i]} GB/s, under half the "
                             f"pinned rate ({pinned[i]} GB/s)")
    ref = vmm or pinned
    m["replay_with"] = (f"SIMCUDA_H2D_GBPS={ref[0]:.0f} SIMCUDA_D2H_GBPS={ref[1]:.0f} "
                        f"SIMCUDA_BIDIR_GBPS={min(ref[2], ref[3]):.0f}")
    notes.append(f"simulator defaults: {SIM_GBPS_PER_DIRECTION:g} GB/s per direction, "
                 f"{SIM_GBPS_BIDIR:g} GB/s each way when both run (docs/sim.md); measured "
                 f"{ref[0]}/{ref[1]} GB/s alone, {ref[2]}/{ref[3]} GB/s at once")
    return ("PASS" if ok else "FAIL"), m, notes


def check_e(gpu, args):
    """Times cuMemCreate, cuMemMap + cuMemSetAccess, cuMemUnmap and cuMemRelease for each size in
    --vmm-mib, device and host-NUMA memory: the calls of an eviction (docs/gpu.md)."""
    d, m, notes = gpu.d, {}, []
    numa = gpu.attr(cu.CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID)
    props = {"device": gpu.prop(cu.CU_MEM_LOCATION_TYPE_DEVICE, gpu.dev),
             "host": gpu.prop(cu.CU_MEM_LOCATION_TYPE_HOST_NUMA, numa if numa and numa > 0 else 0)}
    g = max(gpu.granularity(p) for p in props.values())
    for kind, prop in props.items():
        rows = []
        for mib in args.vmm_mib:
            size = -(-(mib << 20) // g) * g
            va = gpu.reserve(size, g)
            h, r, t_create = gpu.create(size, prop)
            if h is None:
                notes.append(f"cuMemCreate({kind}, {mib} MiB) returned {d.error_name(r)}")
                d.check("cuMemAddressFree", va, size)
                break
            t = time.perf_counter()
            gpu.map_rw(va, size, h)
            t_map = time.perf_counter() - t
            t = time.perf_counter()
            d.check("cuMemUnmap", va, size)
            t_unmap = time.perf_counter() - t
            t = time.perf_counter()
            d.check("cuMemRelease", h)
            t_release = time.perf_counter() - t
            d.check("cuMemAddressFree", va, size)
            rows.append({"MiB": size >> 20, "create_ms": round(t_create * 1e3, 3),
                         "map_and_access_ms": round(t_map * 1e3, 3),
                         "unmap_ms": round(t_unmap * 1e3, 3), "release_ms": round(t_release * 1e3, 3)})
        m[kind] = rows
        # Does creating cost by the byte (pinning, zeroing)? The rate beyond the smallest size.
        if len(rows) >= 2 and rows[-1]["create_ms"] - rows[0]["create_ms"] > 0.1:
            gbps = (rows[-1]["MiB"] - rows[0]["MiB"]) * 2**20 / (
                (rows[-1]["create_ms"] - rows[0]["create_ms"]) * 1e6)
            m[f"{kind}_create_GBps_beyond_the_first"] = round(gbps, 2)
            notes.append(f"creating {kind} memory costs about {gbps:.1f} GB/s beyond a fixed cost: "
                         "a first eviction of each size pays it on the job's thread")
    return "PASS" if m.get("device") and m.get("host") else "FAIL", m, notes


# ----------------------------------------------------------------------------
# f: host memory creation on threads, and what it costs other threads' calls
# ----------------------------------------------------------------------------
# How long the main thread's timed calls may run beside another thread's work (seconds): what
# bounds the check if every call waits behind a whole 20 ms creation.
LATENCY_PHASE_LIMIT_S = 20.0
# Units of work (64 MiB pieces) the other thread must finish while an op is timed beside it: 200
# launches take less than one 20 ms creation, and whatever a creation blocks may be held for a part
# of it only, so the phase spans whole creations.
MIN_UNITS_BESIDE = 3

SMALL_CALLS = {
    "launch_sync": "cuLaunchKernel (spw_add_u32 over 1 MiB) + cuStreamSynchronize",
    "event_sync": "cuEventRecord + cuEventSynchronize",
    "device_vmm_cycle": "cuMemCreate (device, one granule) + cuMemMap + cuMemSetAccess + cuMemUnmap "
                        "+ cuMemRelease",
    "h2d_1MiB_sync": "cuMemcpyHtoDAsync of 1 MiB from pinned memory + cuStreamSynchronize",
}
SMALL_CALL_NAMES = {"launch_sync": "a launch + sync", "event_sync": "an event record + sync",
                    "device_vmm_cycle": "a device VMM create/map/unmap/release cycle",
                    "h2d_1MiB_sync": "a 1 MiB copy + sync"}


def latency_summary(seconds):
    """Median, p90 (nearest rank) and max of a list of durations, in microseconds; None if empty."""
    if not seconds:
        return None
    v = sorted(seconds)
    p90 = v[max(0, -(-len(v) * 9 // 10) - 1)]
    return {"n": len(v), "median_us": round(statistics.median(v) * 1e6, 1),
            "p90_us": round(p90 * 1e6, 1), "max_us": round(v[-1] * 1e6, 1)}


def latency_ratios(busy, alone):
    """{op: {median, p90, max}}: how many times as long each op took with the other thread busy."""
    out = {}
    for op, a in alone.items():
        b = busy.get(op)
        if a and b:
            out[op] = {k: round(b[f"{k}_us"] / max(a[f"{k}_us"], 0.1), 2) for k in ("median", "p90", "max")}
    return out


def in_threads(gpu, n, work):
    """Runs work(i) for i < n, each on a thread of its own with the context current, all started at
    once; returns (seconds from the common start to the last one's end, [exception or None])."""
    go = threading.Barrier(n + 1, timeout=60)
    errors = [None] * n

    def body(i):
        # a new thread has no current context, and the driver's calls need one
        r = gpu.d.call("cuCtxSetCurrent", gpu.ctx)
        go.wait()
        try:
            if r != CUDA_SUCCESS:
                raise CudaError("cuCtxSetCurrent", r, gpu.d.error_name(r))
            work(i)
        except (CudaError, AttributeError) as e:
            errors[i] = e

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    go.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, errors


def release_handles(d, handles, errors):
    for h in handles:
        r = d.call("cuMemRelease", h)
        if r != CUDA_SUCCESS:
            errors.append(f"cuMemRelease returned {d.error_name(r)}")
    handles.clear()


def rate(rec, piece):
    """A worker's record of pieces (and their first and last ends) as pieces, MiB, seconds, GB/s."""
    span = rec.pop("end", 0) - rec.pop("start", 0)
    rec["pieces"] = max(0, rec["pieces"])
    if rec["pieces"] and span > 0:
        rec.update(MiB=rec["pieces"] * piece >> 20, s=round(span, 4),
                   GBps=round(rec["pieces"] * piece / (span * 1e9), 2))
    return rec


def creation_by_threads(gpu, piece, prop, n_pieces, errors):
    """The same n_pieces host pieces created on 1, 2, 4 and 8 threads, each count's released (on
    as many threads) before the next: one row per thread count."""
    d, rows = gpu.d, []
    for n in (1, 2, 4, 8):
        counts = [n_pieces // n + (i < n_pieces % n) for i in range(n)]
        held = [[] for _ in range(n)]

        def create(i):
            for _ in range(counts[i]):
                h, r, _ = gpu.create(piece, prop)
                if h is None:
                    raise CudaError("cuMemCreate", r, d.error_name(r))
                held[i].append(h)

        t_create, errs = in_threads(gpu, n, create)
        made = sum(len(x) for x in held)
        t_release, errs_r = in_threads(gpu, n, lambda i: release_handles(d, held[i], errors))
        errors += [f"{n} threads: {e}" for e in errs + errs_r if e]
        rows.append({"threads": n, "pieces": made, "create_s": round(t_create, 4),
                     "create_GBps": round(made * piece / (t_create * 1e9), 2),
                     "release_s": round(t_release, 4),
                     "release_GBps": round(made * piece / (t_release * 1e9), 2)})
        if made < n_pieces:
            break
    return rows


class SmallCalls:
    """The job's kind of driver calls (SMALL_CALLS), each timed on the calling thread."""

    def __init__(self, gpu, dprop):
        self.gpu, self.d, self.dprop = gpu, gpu.d, dprop
        self.g = gpu.granularity(dprop)
        self.size = 1 << 20
        self.s, self.ev = gpu.stream(), gpu.event()
        self.dbuf, self.hbuf = cu.CUdeviceptr(), ctypes.c_void_p()
        self.d.check("cuMemAlloc", ctypes.byref(self.dbuf), self.size)
        self.d.check("cuMemHostAlloc", ctypes.byref(self.hbuf), self.size, cu.CU_MEMHOSTALLOC_PORTABLE)
        self.va = gpu.reserve(self.g, self.g)
        self.fns = gpu.kernels()
        self.parts = {}  # the device VMM cycle's calls, each timed: which of them waits?
        self.ops = {"launch_sync": self.launch_sync, "event_sync": self.event_sync,
                    "device_vmm_cycle": self.device_vmm_cycle, "h2d_1MiB_sync": self.h2d_sync}
        if not self.fns:
            del self.ops["launch_sync"]

    def launch_sync(self):
        self.gpu.launch(self.fns[0], self.s, ctypes.c_uint64(self.dbuf.value),
                        ctypes.c_uint64(self.size // 4), ctypes.c_uint32(1))
        self.d.check("cuStreamSynchronize", self.s)

    def event_sync(self):
        self.d.check("cuEventRecord", self.ev, self.s)
        self.d.check("cuEventSynchronize", self.ev)

    def device_vmm_cycle(self):  # what each cached release and re-creation of a device block costs
        h, t = ctypes.c_uint64(), [time.perf_counter()]
        self.d.check("cuMemCreate", ctypes.byref(h), self.g, ctypes.byref(self.dprop), 0)
        t.append(time.perf_counter())
        self.gpu.map_rw(self.va, self.g, h.value)
        t.append(time.perf_counter())
        self.d.check("cuMemUnmap", self.va, self.g)
        t.append(time.perf_counter())
        self.d.check("cuMemRelease", h.value)
        t.append(time.perf_counter())
        for i, part in enumerate(("cuMemCreate", "cuMemMap+cuMemSetAccess", "cuMemUnmap", "cuMemRelease")):
            self.parts.setdefault(part, []).append(t[i + 1] - t[i])

    def parts_median_us(self):
        """{call: median us} of the device VMM cycle's calls since the last timed()."""
        return {k: round(statistics.median(v) * 1e6, 1) for k, v in self.parts.items() if v}

    def h2d_sync(self):
        self.d.check("cuMemcpyHtoDAsync", self.dbuf.value, self.hbuf, self.size, self.s)
        self.d.check("cuStreamSynchronize", self.s)

    def timed(self, op, iters, busy=None, enough=lambda: True):
        """[seconds] of op: iters times and until enough(), unless busy (an Event) is set first."""
        f, t = self.ops[op], []
        self.parts = {}
        end = time.perf_counter() + LATENCY_PHASE_LIMIT_S
        while len(t) < iters or not enough():
            if busy is not None and (busy.is_set() or time.perf_counter() > end):
                break
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
        return t

    def beside(self, iters, worker, errors):
        """({op: latency_summary}, {op: the other thread's record}, {call: median us} of the device
        VMM cycle's calls): each op timed in a phase of
        its own (one slow op must not cut the others' samples short), at least iters times and
        across MIN_UNITS_BESIDE units of work, while worker(stop, started, record) runs on another
        thread with the context current. That thread does its first unit alone (it sets `started`
        after it), so that the calls are timed beside its steady state. The GIL: it holds it only
        between its calls, a few microseconds per 64 MiB, which can move a max, not a median."""
        lat, recs, parts = {}, {}, {}
        for op in self.ops:
            stop, started, done = threading.Event(), threading.Event(), threading.Event()
            rec = recs[op] = {"pieces": -1}  # the first, done alone, not counted

            def body():
                try:
                    self.d.check("cuCtxSetCurrent", self.gpu.ctx)
                    worker(stop, started, rec)
                except (CudaError, AttributeError) as e:
                    errors.append(str(e))
                finally:
                    started.set()
                    done.set()

            th = threading.Thread(target=body, daemon=True)
            th.start()
            try:
                started.wait(60)
                lat[op] = latency_summary(self.timed(op, iters, busy=done,
                                                     enough=lambda: rec["pieces"] >= MIN_UNITS_BESIDE))
            finally:
                stop.set()
                th.join()
            parts = parts or self.parts_median_us()
        return lat, recs, parts

    def close(self):
        self.d.check("cuMemAddressFree", self.va, self.g)
        self.d.check("cuMemFree", self.dbuf.value)
        self.d.check("cuMemFreeHost", self.hbuf)


def check_f(gpu, args):
    """(1) Host-NUMA creation in pieces on 1, 2, 4 and 8 threads; (2) the job's kind of small
    driver calls on the main thread alone, while another thread creates host memory (spillway's
    reserve thread), and while another thread only writes host memory (no driver call)."""
    d, m, notes, errors = gpu.d, {}, [], []
    # A thread coming back from a call waits for the GIL while another thread loops through short
    # calls, up to the switch interval (5 ms by default): a quarter of a 20 ms creation. Every
    # thread here spends its time in foreign calls, so frequent switches cost nothing else.
    sys.setswitchinterval(1e-4)
    numa = gpu.attr(cu.CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID)
    hprop = gpu.prop(cu.CU_MEM_LOCATION_TYPE_HOST_NUMA, numa if numa and numa > 0 else 0)
    dprop = gpu.prop(cu.CU_MEM_LOCATION_TYPE_DEVICE, gpu.dev)
    gh = gpu.granularity(hprop)
    piece = max(gh, -(-(args.piece_mib << 20) // gh) * gh)
    n_pieces = max(1, (args.create_mib << 20) // piece)
    m.update(piece_MiB=piece >> 20, create_total_MiB=n_pieces * piece >> 20, cpus=os.cpu_count())

    # A first host creation may pay one-off costs (the driver's host allocator, NUMA policy) that
    # no rate below should carry.
    h, r, _ = gpu.create(piece, hprop)
    if h is None:
        return "FAIL", m, [f"cuMemCreate(HOST_NUMA, {piece >> 20} MiB) returned {d.error_name(r)}"]
    release_handles(d, [h], errors)

    # 1. Does creation scale with threads?
    rows = m["host_create_by_threads"] = creation_by_threads(gpu, piece, hprop, n_pieces, errors)
    if n_pieces < 8:
        notes.append(f"only {n_pieces} pieces of {piece >> 20} MiB: with more threads than pieces "
                     "some threads had nothing to create (raise --create-mib)")
    # part 1's figures survive a death in part 2
    emit({"check": "f", "partial": True, "status": "FAIL", "measured": m,
          "notes": notes + [f"error: {e}" for e in errors[:5]] + ["part 2 (the timed calls) did not end"]})

    # 2. Do the job's calls wait while another thread creates host memory?
    cap = max(1, (args.busy_mib << 20) // piece)

    def one_more(rec, started):
        rec["pieces"] += 1
        rec["end"] = time.perf_counter()
        rec.setdefault("start", rec["end"])
        started.set()

    def creating(stop, started, rec):
        held = []
        try:
            while not stop.is_set() and len(held) < cap:
                h, r, _ = gpu.create(piece, hprop)
                if h is None:
                    raise CudaError("cuMemCreate", r, d.error_name(r))
                held.append(h)
                one_more(rec, started)
            rec["stopped_by"] = "the calls' end" if stop.is_set() else "its cap"
        finally:
            release_handles(d, held, errors)

    # The control: another thread writes host memory as fast as it can (memory bandwidth and a busy
    # core, as creation's page clearing takes) without calling the driver. Creation's ratios far
    # above this one's: the job waits on the driver, not on the memory.
    buf = ctypes.create_string_buffer(piece)

    def writing(stop, started, rec):
        while not stop.is_set():
            ctypes.memset(buf, rec["pieces"] & 0xFF, piece)  # releases the GIL, as a driver call does
            one_more(rec, started)

    try:
        calls = SmallCalls(gpu, dprop)
        m["calls"] = {k: v for k, v in SMALL_CALLS.items() if k in calls.ops}
        if not calls.fns:
            m["launch_sync"] = f"not measured: no kernel ({gpu._module_error})"
        alone, parts = {}, {}
        m["device_vmm_cycle_calls_median_us"] = parts
        for op in calls.ops:
            calls.timed(op, 10)  # the first calls load and allocate what the later ones reuse
            alone[op] = latency_summary(calls.timed(op, args.latency_iters))
            parts["alone"] = parts.get("alone") or calls.parts_median_us()
        m["latency_alone"] = alone
        for worker, lat_key, ratio_key, other in (
                (creating, "latency_during_host_creation", "during_creation_vs_alone", "creating_thread"),
                (writing, "latency_during_host_writes", "during_writes_vs_alone", "writing_thread")):
            lat, recs, parts[lat_key[len("latency_"):]] = calls.beside(args.latency_iters, worker, errors)
            m[lat_key], m[ratio_key] = lat, latency_ratios(lat, alone)
            m[other] = {op: rate(rec, piece) for op, rec in recs.items()}
        calls.close()
    except (CudaError, AttributeError) as e:
        errors.append(f"the timed calls: {e}")
    del buf

    if rows:
        notes.append("host creation: " + ", ".join(
            f"{r['threads']} thread{'s' if r['threads'] > 1 else ''} {r['create_GBps']} GB/s" for r in rows)
            + f" ({m['create_total_MiB']} MiB in {piece >> 20} MiB pieces); release: "
            + ", ".join(f"{r['threads']}: {r['release_GBps']} GB/s" for r in rows))
        best = max(rows, key=lambda r: r["create_GBps"])
        if best is rows[0]:
            notes.append("no number of threads created faster than one thread")
        else:
            notes.append(f"the best, {best['threads']} threads, created at "
                         f"{best['create_GBps'] / rows[0]['create_GBps']:.2f}x one thread's rate")
    for label, key in (("during host creation on another thread", "during_creation_vs_alone"),
                       ("during host writes (memset, no driver call) on another thread",
                        "during_writes_vs_alone")):
        for op in m.get("latency_alone", {}) if key in m else ():
            v = m[key].get(op)
            if v is None:
                notes.append(f"{label}, {SMALL_CALL_NAMES[op]}: none timed (the other thread stopped first)")
            else:
                notes.append(f"{label}, {SMALL_CALL_NAMES[op]} took {v['median']}x as long at the median, "
                             f"{v['p90']}x at p90, {v['max']}x at the max")
    parts = m.get("device_vmm_cycle_calls_median_us", {})
    if parts.get("alone") and parts.get("during_host_creation"):
        notes.append("during host creation, the device VMM cycle's calls took at the median: " + ", ".join(
            f"{k} {v} us ({parts['alone'].get(k)} alone)" for k, v in parts["during_host_creation"].items()))
    bg = list(m.get("creating_thread", {}).values())
    made, span = sum(r["pieces"] for r in bg), sum(r.get("s", 0) for r in bg)
    if made and span > 0:
        notes.append(f"the creating thread made {made} pieces ({made * piece >> 20} MiB) in {span:.3f} s "
                     f"beside the timed calls: {made * piece / (span * 1e9):.2f} GB/s, against "
                     f"{rows[0]['create_GBps'] if rows else '?'} GB/s for one thread alone")
    for op, r in m.get("creating_thread", {}).items():
        if r.get("stopped_by") == "its cap":
            n = (m["latency_during_host_creation"].get(op) or {}).get("n", 0)
            notes.append(f"{SMALL_CALL_NAMES[op]}: the creating thread reached --busy-mib {args.busy_mib} "
                         f"first, {n} of {args.latency_iters} calls timed beside it")
    notes += [f"error: {e}" for e in errors[:5]]
    return ("FAIL" if errors else "PASS"), m, notes


# ----------------------------------------------------------------------------
# g: device memory as granules mapped side by side
# ----------------------------------------------------------------------------
def check_g(gpu, args):
    """A block backed by several one-granule handles mapped at adjacent offsets of one range, as a
    pool of fixed-size handles would back it (docs/residency.md, session 16): (1) does one
    cuMemSetAccess and one cuMemUnmap cover several mappings, and does each handle's data follow it
    when the handles are mapped again in another order; (2) what mapping, granting and unmapping k
    granules costs against one handle of k granules (created and released, or pooled)."""
    d, m, notes = gpu.d, {}, []
    prop = gpu.prop(cu.CU_MEM_LOCATION_TYPE_DEVICE, gpu.dev)
    g = gpu.granularity(prop)
    m["granularity"] = g
    desc = cu.CUmemAccessDesc()
    desc.location.type = cu.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = gpu.dev
    desc.flags = cu.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    ok = True

    def grant(va, n):
        """One cuMemSetAccess over n granules, else one per granule; (result name, seconds)."""
        t = time.perf_counter()
        r = d.call("cuMemSetAccess", va, n * g, ctypes.byref(desc), 1)
        if r != CUDA_SUCCESS:
            for i in range(n):
                d.check("cuMemSetAccess", va + i * g, g, ctypes.byref(desc), 1)
        return d.error_name(r), time.perf_counter() - t

    def unmap(va, n):
        """One cuMemUnmap over n granules, else one per granule; (result name, seconds)."""
        t = time.perf_counter()
        r = d.call("cuMemUnmap", va, n * g)
        if r != CUDA_SUCCESS:
            for i in range(n):
                d.check("cuMemUnmap", va + i * g, g)
        return d.error_name(r), time.perf_counter() - t

    def granules(n):
        hs = []
        for _ in range(n):
            h, r, _ = gpu.create(g, prop)
            if h is None:
                for x in hs:
                    d.check("cuMemRelease", x)
                raise CudaError("cuMemCreate", r, d.error_name(r))
            hs.append(h)
        return hs

    # 1. semantics, on four granules
    k = 4
    va = gpu.reserve(k * g, g)
    hs = granules(k)
    for i, h in enumerate(hs):
        d.check("cuMemMap", va + i * g, g, 0, h, 0)
    m["access_over_4_mappings"], _ = grant(va, k)
    data = pattern(k * g // 4, 11)
    gpu.write(va, data)  # one copy across the mappings' boundaries
    fns = gpu.kernels()
    if fns:  # a kernel across them too
        gpu.launch(fns[0], None, ctypes.c_uint64(va), ctypes.c_uint64(k * g // 4), ctypes.c_uint32(1))
        d.check("cuCtxSynchronize")
        data = plus(data, 1)
    m["kernel"] = "PTX spw_add_u32" if fns else f"none ({gpu._module_error}); copies only"
    steps = [f"4 granules side by side, written across them: {'intact' if gpu.read(va, k * g) == data else 'DATA MISMATCH'}"]
    ok = ok and steps[-1].endswith("intact")
    m["unmap_2_of_4_mappings"], _ = unmap(va + g, 2)
    d.check("cuMemMap", va + g, g, 0, hs[2], 0)  # the two handles swap places
    d.check("cuMemMap", va + 2 * g, g, 0, hs[1], 0)
    m["access_over_2_remapped"], _ = grant(va + g, 2)
    moved = data[:g] + data[2 * g:3 * g] + data[g:2 * g] + data[3 * g:]
    steps.append("granules 1 and 2 mapped again in each other's place, data followed its handle: "
                 + ("intact" if gpu.read(va, k * g) == moved else "DATA MISMATCH"))
    ok = ok and steps[-1].endswith("intact")
    m["unmap_over_4_mappings"], _ = unmap(va, k)
    for h in hs:
        d.check("cuMemRelease", h)
    d.check("cuMemAddressFree", va, k * g)
    m["steps"] = steps

    # 2. costs: k granules from a pool (mapped one by one, one grant, one unmap) against one handle
    # of k granules, created and released (a block made anew) or pooled (map, grant, unmap only)
    rows = []
    for k in args.granules:
        va = gpu.reserve(k * g, g)
        hs = granules(k)
        runs = {key: [] for key in ("granules_map", "granules_access", "granules_unmap", "handle_create",
                                    "handle_map", "handle_access", "handle_unmap", "handle_release")}
        for rep in range(args.granule_reps + 1):  # the first round is not timed: one-off costs
            t = time.perf_counter()
            for i, h in enumerate(hs):
                d.check("cuMemMap", va + i * g, g, 0, h, 0)
            t_map = time.perf_counter() - t
            r_access, t_access = grant(va, k)
            r_unmap, t_unmap = unmap(va, k)
            h, r, t_create = gpu.create(k * g, prop)
            if h is None:
                raise CudaError("cuMemCreate", r, d.error_name(r))
            t = time.perf_counter()
            d.check("cuMemMap", va, k * g, 0, h, 0)
            t_hmap = time.perf_counter() - t
            _, t_haccess = grant(va, k) if k == 1 else (None, 0.0)
            if k > 1:  # one mapping: a single call whatever the driver does with several
                t = time.perf_counter()
                d.check("cuMemSetAccess", va, k * g, ctypes.byref(desc), 1)
                t_haccess = time.perf_counter() - t
            t = time.perf_counter()
            d.check("cuMemUnmap", va, k * g)
            t_hunmap = time.perf_counter() - t
            t = time.perf_counter()
            d.check("cuMemRelease", h)
            t_hrelease = time.perf_counter() - t
            if rep:
                for key, v in zip(runs, (t_map, t_access, t_unmap, t_create, t_hmap, t_haccess, t_hunmap,
                                         t_hrelease)):
                    runs[key].append(v)
        for h in hs:
            d.check("cuMemRelease", h)
        d.check("cuMemAddressFree", va, k * g)
        row = {"granules": k, "MiB": k * g >> 20, "access_one_call": r_access, "unmap_one_call": r_unmap}
        row.update({f"{key}_ms": round(statistics.median(v) * 1e3, 3) for key, v in runs.items()})
        row["granules_total_ms"] = round(row["granules_map_ms"] + row["granules_access_ms"]
                                         + row["granules_unmap_ms"], 3)
        row["pooled_handle_total_ms"] = round(row["handle_map_ms"] + row["handle_access_ms"]
                                              + row["handle_unmap_ms"], 3)
        row["new_handle_total_ms"] = round(row["pooled_handle_total_ms"] + row["handle_create_ms"]
                                           + row["handle_release_ms"], 3)
        rows.append(row)
    m["by_size"] = rows
    m["reps"] = args.granule_reps

    for key, what in (("access_over_4_mappings", "one cuMemSetAccess over 4 adjacent mappings"),
                      ("unmap_2_of_4_mappings", "one cuMemUnmap over 2 of 4 adjacent mappings"),
                      ("unmap_over_4_mappings", "one cuMemUnmap over 4 adjacent mappings")):
        notes.append(f"{what}: " + ("accepted" if m[key] == "CUDA_SUCCESS" else
                                    f"refused ({m[key]}); done one mapping at a time instead"))
    for row in rows:
        notes.append(f"{row['MiB']} MiB as {row['granules']} granules: map + grant + unmap "
                     f"{row['granules_total_ms']} ms (maps {row['granules_map_ms']}); as one handle "
                     f"{row['pooled_handle_total_ms']} ms pooled, {row['new_handle_total_ms']} ms created "
                     f"and released (median of {args.granule_reps})")
    return ("PASS" if ok else "FAIL"), m, notes


# ----------------------------------------------------------------------------
# h: device VMM calls on several threads
# ----------------------------------------------------------------------------
def check_h(gpu, args):
    """(1) Device VMM cycles (create, map, grant, unmap, release of one granule) on 1, 2 and 4
    threads at once: does the driver run them side by side, or one at a time? (2) The job's kind of
    calls on the main thread while another thread makes such cycles without pause (spillway's mover
    beside the job's thread)."""
    d, m, notes, errors = gpu.d, {}, [], []
    sys.setswitchinterval(1e-4)  # as in f: threads that live in foreign calls
    dprop = gpu.prop(cu.CU_MEM_LOCATION_TYPE_DEVICE, gpu.dev)
    g = gpu.granularity(dprop)
    n = args.vmm_cycles
    m.update(cycles_per_thread=n, granularity=g)

    def cycles(va, count, stop=None, rec=None, started=None):
        h = ctypes.c_uint64()
        done = 0
        while (stop is None and done < count) or (stop is not None and not stop.is_set()):
            d.check("cuMemCreate", ctypes.byref(h), g, ctypes.byref(dprop), 0)
            gpu.map_rw(va, g, h.value)
            d.check("cuMemUnmap", va, g)
            d.check("cuMemRelease", h.value)
            done += 1
            if rec is not None:
                rec["pieces"] += 1
                if started is not None:
                    started.set()

    rows = []
    cycles(gpu.reserve(g, g), 10)  # one-off costs out of the first rate
    for threads in (1, 2, 4):
        vas = [gpu.reserve(g, g) for _ in range(threads)]
        wall, errs = in_threads(gpu, threads, lambda i: cycles(vas[i], n))
        errors += [str(e) for e in errs if e]
        for va in vas:
            d.check("cuMemAddressFree", va, g)
        rows.append({"threads": threads, "cycles": threads * n, "wall_s": round(wall, 4),
                     "cycles_per_s": round(threads * n / wall, 1)})
    for r in rows:
        r["vs_one_thread"] = round(r["cycles_per_s"] / rows[0]["cycles_per_s"], 2)
    m["cycles_by_threads"] = rows
    emit({"check": "h", "partial": True, "status": "FAIL", "measured": m,
          "notes": [f"error: {e}" for e in errors[:5]] + ["part 2 (the timed calls) did not end"]})

    other_va = gpu.reserve(g, g)

    def cycling(stop, started, rec):
        cycles(other_va, 0, stop, rec, started)

    try:
        calls = SmallCalls(gpu, dprop)
        alone = {}
        for op in calls.ops:
            calls.timed(op, 10)
            alone[op] = latency_summary(calls.timed(op, args.latency_iters))
        m["latency_alone"] = alone
        lat, _, parts = calls.beside(args.latency_iters, cycling, errors)
        m["latency_beside_vmm_cycles"] = lat
        m["beside_vs_alone"] = latency_ratios(lat, alone)
        m["device_vmm_cycle_calls_median_us_beside"] = parts
        calls.close()
    except (CudaError, AttributeError) as e:
        errors.append(f"the timed calls: {e}")
    d.check("cuMemAddressFree", other_va, g)

    notes.append("device VMM cycles: " + ", ".join(
        f"{r['threads']} thread{'s' if r['threads'] > 1 else ''} {r['cycles_per_s']}/s ({r['vs_one_thread']}x)"
        for r in rows) + ": " + ("they run side by side" if rows[-1]["vs_one_thread"] >= 1.5 else
                                 "the driver makes them one at a time (or nearly)"))
    for op, v in m.get("beside_vs_alone", {}).items():
        notes.append(f"beside another thread's VMM cycles, {SMALL_CALL_NAMES[op]} took {v['median']}x "
                     f"as long at the median, {v['p90']}x at p90")
    notes += [f"error: {e}" for e in errors[:5]]
    return ("FAIL" if errors else "PASS"), m, notes


RUNNERS = {"a": check_a, "b": check_b, "c": check_c, "d": check_d, "e": check_e, "f": check_f,
           "g": check_g, "h": check_h}


def run_child(args):
    name = args.child
    try:
        gpu = Gpu(args.cuda_lib, args.device)
        status, measured, notes = RUNNERS[name](gpu, args)
        emit({"check": name, "status": status, "measured": measured, "notes": notes})
    except Skip as e:
        emit({"check": name, "status": "SKIP", "measured": {}, "notes": [str(e)]})
    except (CudaError, AttributeError, OSError) as e:
        emit({"check": name, "status": "FAIL", "measured": {}, "notes": [f"error: {e}"]})
    return 0


# ----------------------------------------------------------------------------
# the parent: GPU presence, then each check in a child
# ----------------------------------------------------------------------------
def probe(lib, ordinal):
    """(info dict, None) with a usable device, or (None, reason)."""
    try:
        d = cu.Driver(lib)
    except OSError as e:
        return None, f"cannot load {lib} ({e}): no NVIDIA driver on this machine"
    try:
        r = d.call("cuInit", 0)
        if r != CUDA_SUCCESS:
            return None, f"cuInit returned {d.error_name(r)}: no usable GPU"
        n = ctypes.c_int()
        r = d.call("cuDeviceGetCount", ctypes.byref(n))
        if r != CUDA_SUCCESS or n.value == 0:
            return None, "the driver reports no CUDA device"
        if ordinal >= n.value:
            return None, f"device {ordinal} requested, the driver reports {n.value}"
        dev = ctypes.c_int()
        d.check("cuDeviceGet", ctypes.byref(dev), ordinal)
        name = ctypes.create_string_buffer(256)
        info = {"devices": n.value, "library": lib}
        if d.call("cuDeviceGetName", name, 256, dev.value) == CUDA_SUCCESS:
            info["name"] = name.value.decode(errors="replace")
        v = ctypes.c_int()
        if d.call("cuDriverGetVersion", ctypes.byref(v)) == CUDA_SUCCESS:
            info["driver_cuda_version"] = f"{v.value // 1000}.{v.value % 1000 // 10}"
        mem = ctypes.c_size_t()
        if d.call("cuDeviceTotalMem", ctypes.byref(mem), dev.value) == CUDA_SUCCESS:
            info["memory_GiB"] = round(mem.value / 2**30, 2)
        cc = (d.attribute(cu.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev.value)[0],
              d.attribute(cu.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev.value)[0])
        info["compute_capability"] = f"{cc[0]}.{cc[1]}"
        return info, None
    except (AttributeError, CudaError) as e:
        return None, f"{lib} is not a usable CUDA driver ({e})"


def print_result(res):
    print(f"[{res['status']}] ({res['check']}) {CHECKS[res['check']]}")
    for k, v in res.get("measured", {}).items():
        print(f"    {k}: {json.dumps(v) if isinstance(v, (dict, list)) else v}")
    for n in res.get("notes", []):
        print(f"    note: {n}")
    if res["status"] == "FAIL":
        print(f"    if it fails: {IF_FAILS[res['check']]}")
    print()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="docs/gpu.md explains each check and what to report.")
    p.add_argument("--checks", default="a,b,c,d,e,f,g,h",
                   help="comma-separated subset of a,b,c,d,e,f,g,h (default: all)")
    p.add_argument("--device", type=int, default=0, help="CUDA device ordinal (default 0)")
    p.add_argument("--cuda-lib", default="libcuda.so.1", help="driver library (default libcuda.so.1)")
    p.add_argument("--cupti-lib", default=None, help="CUPTI library (default: found automatically)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")
    p.add_argument("--bw-mib", type=int, default=256, help="bytes per copy in check d, MiB (default 256)")
    p.add_argument("--bw-reps", type=int, default=10, help="copies per measurement in check d (default 10)")
    p.add_argument("--vmm-mib", type=lambda t: [int(x) for x in t.split(",")], default=[2, 32, 256, 1024],
                   help="block sizes timed in check e, MiB (default 2,32,256,1024)")
    p.add_argument("--create-mib", type=int, default=2048,
                   help="host memory created per thread count in check f, MiB (default 2048)")
    p.add_argument("--piece-mib", type=int, default=64,
                   help="size of each host creation in check f, MiB (default 64, spillway's piece)")
    p.add_argument("--latency-iters", type=int, default=200,
                   help="timed iterations of each small call in check f, per condition (default 200)")
    p.add_argument("--busy-mib", type=int, default=8192,
                   help="most host memory the creating thread of check f holds at once, MiB (default 8192)")
    p.add_argument("--granules", type=lambda t: [int(x) for x in t.split(",")], default=[1, 8, 64, 256],
                   help="block sizes timed in check g, in granules (default 1,8,64,256)")
    p.add_argument("--granule-reps", type=int, default=5,
                   help="timed rounds of each size in check g; the median is reported (default 5)")
    p.add_argument("--vmm-cycles", type=int, default=200,
                   help="device VMM cycles per thread in check h (default 200)")
    p.add_argument("--pending-ms", type=float, default=300.0,
                   help="duration of the pending work in check c, ms (default 300)")
    p.add_argument("--memset-chain", type=int, default=2000,
                   help="memsets queued in check c when no kernel can be loaded (default 2000)")
    p.add_argument("--no-unsafe", action="store_true",
                   help="check c: skip the unmap under pending work (it may fault the GPU context)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per check (default 300)")
    p.add_argument("--child", choices=sorted(RUNNERS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    names = [c.strip() for c in args.checks.split(",") if c.strip()]
    bad = [c for c in names if c not in CHECKS]
    if any(k < 1 for k in args.granules):
        p.error("--granules: every size must be at least 1")
    if bad or not names:
        p.error(f"--checks: unknown {', '.join(bad) or '(empty)'}; accepted: {', '.join(CHECKS)}")
    for opt in ("create_mib", "piece_mib", "latency_iters", "busy_mib", "granule_reps", "vmm_cycles"):
        if getattr(args, opt) < 1:
            p.error(f"--{opt.replace('_', '-')} must be at least 1")
    args.check_list = names
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        return run_child(args)
    info, why = probe(args.cuda_lib, args.device)
    if info is None:
        print(f"check_assumptions: no GPU: {why}. Nothing was checked (exit status 2).", file=sys.stderr)
        return 2
    print("spillway GPU assumption checks (docs/gpu.md)")
    print("device: " + ", ".join(f"{k} {v}" for k, v in info.items()))
    print(f"python {sys.version.split()[0]}")
    import importlib.util
    if importlib.util.find_spec("torch") is None:  # not imported here: slow, and it may touch CUDA
        print("torch: not importable (check b will be skipped)")
    else:
        try:
            import importlib.metadata
            print(f"torch {importlib.metadata.version('torch')}")
        except Exception:
            print("torch: importable")
    print()
    results = []
    me = os.path.abspath(__file__)
    passthrough = ["--device", str(args.device), "--cuda-lib", args.cuda_lib,
                   "--bw-mib", str(args.bw_mib), "--bw-reps", str(args.bw_reps),
                   "--pending-ms", str(args.pending_ms), "--memset-chain", str(args.memset_chain),
                   "--vmm-mib", ",".join(str(x) for x in args.vmm_mib),
                   "--create-mib", str(args.create_mib), "--piece-mib", str(args.piece_mib),
                   "--latency-iters", str(args.latency_iters), "--busy-mib", str(args.busy_mib),
                   "--granules", ",".join(str(x) for x in args.granules),
                   "--granule-reps", str(args.granule_reps), "--vmm-cycles", str(args.vmm_cycles)]
    if args.cupti_lib:
        passthrough += ["--cupti-lib", args.cupti_lib]
    if args.no_unsafe:
        passthrough.append("--no-unsafe")
    for name in args.check_list:
        try:
            proc = subprocess.run([sys.executable, me, "--child", name] + passthrough,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  timeout=args.timeout)
            out, err, rc = proc.stdout, proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as e:
            out, err, rc = (e.stdout or ""), (e.stderr or ""), f"timeout after {args.timeout} s"
            out = out.decode() if isinstance(out, bytes) else out
            err = err.decode() if isinstance(err, bytes) else err
        found = [json.loads(line[len(RESULT_TAG):]) for line in out.splitlines() if line.startswith(RESULT_TAG)]
        final = [r for r in found if not r.get("partial")]
        if final:
            res = final[-1]
        else:
            res = found[-1] if found else {"check": name, "status": "FAIL", "measured": {}, "notes": []}
            res.pop("partial", None)
            res["notes"] = res.get("notes", []) + [
                f"the check's process ended without a final result (exit {rc}); stderr: "
                + (err.strip().splitlines() or ["(empty)"])[-1]]
            if name == "c" and res["status"] == "PASS":
                res["notes"].append("it died during the unmap under pending work: that is the finding")
        results.append(res)
        print_result(res)
    statuses = [r["status"] for r in results]
    summary = {s: statuses.count(s) for s in ("PASS", "FAIL", "SKIP")}
    print("summary: " + ", ".join(f"{v} {k}" for k, v in summary.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": info, "results": results, "summary": summary}, f, indent=2)
    return 1 if "FAIL" in statuses else 0


if __name__ == "__main__":
    sys.exit(main())
