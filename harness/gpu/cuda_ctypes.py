"""ctypes mirrors of the CUDA 13 driver and CUPTI declarations the GPU scripts use.

Pure Python, no compilation. Every constant cites the header it comes from
(/usr/local/cuda/include of the CUDA 13.0 toolkit); every struct is mirrored
field by field, and tests/python_gpu/test_ctypes_layout.py compiles a C
program against those headers to check sizeof/offsetof of each one listed in
MIRRORED.

Importing this module loads nothing: Driver() and Cupti() open the libraries.
"""
import ctypes
import os

c_int, c_uint, c_size_t, c_void_p = ctypes.c_int, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p
c_uint32, c_uint64, c_char_p = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_char_p

# --- cuda.h: CUresult -------------------------------------------------------
CUDA_SUCCESS = 0                      # cuda.h, enum cudaError_enum
CUDA_ERROR_INVALID_VALUE = 1          # cuda.h
CUDA_ERROR_NOT_INITIALIZED = 3        # cuda.h
CUDA_ERROR_NO_DEVICE = 100            # cuda.h
CUDA_ERROR_NOT_FOUND = 500            # cuda.h (a symbol not found by name)
CUDA_ERROR_NOT_READY = 600            # cuda.h
CUDA_ERROR_ILLEGAL_ADDRESS = 700      # cuda.h
CUDA_ERROR_NOT_PERMITTED = 800        # cuda.h
CUDA_ERROR_NOT_SUPPORTED = 801        # cuda.h

# --- cuda.h: CUdevice_attribute ----------------------------------------------
CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13                                   # cuda.h (kHz)
CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT = 40                           # cuda.h
CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41                           # cuda.h
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75                     # cuda.h
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76                     # cuda.h
CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102         # cuda.h
CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID = 134                                # cuda.h ("-1 when system does not support NUMA")
CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 141  # cuda.h

# --- cuda.h: VMM enums ---------------------------------------------------------
CU_MEM_LOCATION_TYPE_DEVICE = 0x1     # cuda.h, CUmemLocationType
CU_MEM_LOCATION_TYPE_HOST = 0x2       # cuda.h, CUmemLocationType
CU_MEM_LOCATION_TYPE_HOST_NUMA = 0x3  # cuda.h, CUmemLocationType
CU_MEM_ALLOCATION_TYPE_PINNED = 0x1   # cuda.h, CUmemAllocationType
CU_MEM_HANDLE_TYPE_NONE = 0x0         # cuda.h, CUmemAllocationHandleType
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3  # cuda.h, CUmemAccess_flags
CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0    # cuda.h, CUmemAllocationGranularity_flags

# --- cuda.h: streams, events, host memory --------------------------------------
CU_STREAM_NON_BLOCKING = 0x1          # cuda.h, CUstream_flags
CU_EVENT_DEFAULT = 0x0                # cuda.h, CUevent_flags
CU_MEMHOSTALLOC_PORTABLE = 0x01       # cuda.h, #define

# --- cupti_callbacks.h / cupti_result.h ----------------------------------------
CUPTI_SUCCESS = 0                                   # cupti_result.h
CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED = 39  # cupti_result.h
CUPTI_API_ENTER = 0                                 # cupti_callbacks.h, CUpti_ApiCallbackSite
CUPTI_API_EXIT = 1                                  # cupti_callbacks.h
CUPTI_CB_DOMAIN_DRIVER_API = 1                      # cupti_callbacks.h, CUpti_CallbackDomain
CUPTI_CB_DOMAIN_RUNTIME_API = 2                     # cupti_callbacks.h

# cupti_driver_cbid.h: the driver launch callbacks spillway enables (design.md 5)
DRIVER_LAUNCH_CBIDS = {
    307: "cuLaunchKernel",                    # CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel
    442: "cuLaunchKernel_ptsz",               # CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz
    477: "cuLaunchCooperativeKernel",         # CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel
    478: "cuLaunchCooperativeKernel_ptsz",    # CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz
    652: "cuLaunchKernelEx",                  # CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx
    653: "cuLaunchKernelEx_ptsz",             # CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz
}
# cupti_runtime_cbid.h: the runtime launch callbacks
RUNTIME_LAUNCH_CBIDS = {
    211: "cudaLaunchKernel_v7000",            # CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000
    214: "cudaLaunchKernel_ptsz_v7000",       # CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000
    430: "cudaLaunchKernelExC_v11060",        # CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060
    431: "cudaLaunchKernelExC_ptsz_v11060",   # CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060
    505: "__cudaLaunchKernel_v13000",         # CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000
    506: "__cudaLaunchKernel_ptsz_v13000",    # CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000
}
# The ids whose params struct starts like cuLaunchKernel_params (f ... hStream):
# generated_cuda_meta.h, cuLaunchKernel_params / cuLaunchKernel_ptsz_params.
DRIVER_CBIDS_WITH_LAUNCH_PARAMS = (307, 442)
# generated_cuda_runtime_api_meta.h, cudaLaunchKernel_v7000_params / _ptsz_v7000_params.
RUNTIME_CBIDS_WITH_LAUNCH_PARAMS = (211, 214)


# --- structs ------------------------------------------------------------------
class CUmemLocation(ctypes.Structure):
    """cuda.h, struct CUmemLocation_st {CUmemLocationType type; int id;}."""
    _fields_ = [("type", c_int), ("id", c_int)]


class CUmemAllocationProp_allocFlags(ctypes.Structure):
    """cuda.h, the anonymous `allocFlags` struct inside CUmemAllocationProp_st."""
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class CUmemAllocationProp(ctypes.Structure):
    """cuda.h, struct CUmemAllocationProp_st."""
    _fields_ = [("type", c_int),                  # CUmemAllocationType
                ("requestedHandleTypes", c_int),  # CUmemAllocationHandleType
                ("location", CUmemLocation),
                ("win32HandleMetaData", c_void_p),
                ("allocFlags", CUmemAllocationProp_allocFlags)]


class CUmemAccessDesc(ctypes.Structure):
    """cuda.h, struct CUmemAccessDesc_st {CUmemLocation location; CUmemAccess_flags flags;}."""
    _fields_ = [("location", CUmemLocation), ("flags", c_int)]


class CUpti_CallbackData(ctypes.Structure):
    """cupti_callbacks.h, CUpti_CallbackData (driver and runtime domains)."""
    _fields_ = [("callbackSite", c_int),          # CUpti_ApiCallbackSite
                ("functionName", c_char_p),
                ("functionParams", c_void_p),
                ("functionReturnValue", c_void_p),
                ("symbolName", c_char_p),
                ("context", c_void_p),            # CUcontext
                ("contextUid", c_uint32),
                ("correlationData", ctypes.POINTER(c_uint64)),
                ("correlationId", c_uint32)]


class cuLaunchKernel_params(ctypes.Structure):
    """generated_cuda_meta.h, struct cuLaunchKernel_params_st."""
    _fields_ = [("f", c_void_p),                  # CUfunction
                ("gridDimX", c_uint), ("gridDimY", c_uint), ("gridDimZ", c_uint),
                ("blockDimX", c_uint), ("blockDimY", c_uint), ("blockDimZ", c_uint),
                ("sharedMemBytes", c_uint),
                ("hStream", c_void_p),            # CUstream
                ("kernelParams", c_void_p),       # void **
                ("extra", c_void_p)]              # void **


class dim3(ctypes.Structure):
    """vector_types.h, struct dim3 {unsigned int x, y, z;}."""
    _fields_ = [("x", c_uint), ("y", c_uint), ("z", c_uint)]


class cudaLaunchKernel_v7000_params(ctypes.Structure):
    """generated_cuda_runtime_api_meta.h, struct cudaLaunchKernel_v7000_params_st."""
    _fields_ = [("func", c_void_p), ("gridDim", dim3), ("blockDim", dim3),
                ("args", c_void_p),               # void **
                ("sharedMem", c_size_t),
                ("stream", c_void_p)]             # cudaStream_t


# ctypes class -> the C type it mirrors (tests/python_gpu checks these against the headers).
MIRRORED = {
    "CUmemLocation": CUmemLocation,
    "CUmemAllocationProp": CUmemAllocationProp,
    "CUmemAccessDesc": CUmemAccessDesc,
    "CUpti_CallbackData": CUpti_CallbackData,
    "cuLaunchKernel_params": cuLaunchKernel_params,
    "cuLaunchKernel_ptsz_params": cuLaunchKernel_params,
    "cudaLaunchKernel_v7000_params": cudaLaunchKernel_v7000_params,
    "cudaLaunchKernel_ptsz_v7000_params": cudaLaunchKernel_v7000_params,
}

# CUpti_CallbackFunc (cupti_callbacks.h): void (*)(void *userdata, CUpti_CallbackDomain,
# CUpti_CallbackId, const void *cbdata)
CUpti_CallbackFunc = ctypes.CFUNCTYPE(None, c_void_p, c_int, c_uint32, c_void_p)

CUdeviceptr = c_uint64  # cuda.h: unsigned long long on 64-bit hosts
P = ctypes.POINTER

# Driver entry points: exported name(s) tried in order -> (restype, argtypes).
# cuda.h maps the plain names to versioned symbols (#define cuMemAlloc cuMemAlloc_v2, ...);
# the legacy unversioned cuMemcpyDtoDAsync takes 32-bit pointers, so never fall back to it.
_DRIVER = {
    "cuInit": (("cuInit",), [c_uint]),
    "cuDriverGetVersion": (("cuDriverGetVersion",), [P(c_int)]),
    "cuDeviceGetCount": (("cuDeviceGetCount",), [P(c_int)]),
    "cuDeviceGet": (("cuDeviceGet",), [P(c_int), c_int]),
    "cuDeviceGetName": (("cuDeviceGetName",), [c_char_p, c_int, c_int]),
    "cuDeviceGetAttribute": (("cuDeviceGetAttribute",), [P(c_int), c_int, c_int]),
    "cuDeviceTotalMem": (("cuDeviceTotalMem_v2",), [P(c_size_t), c_int]),
    "cuDevicePrimaryCtxRetain": (("cuDevicePrimaryCtxRetain",), [P(c_void_p), c_int]),
    "cuCtxSetCurrent": (("cuCtxSetCurrent",), [c_void_p]),
    "cuCtxSynchronize": (("cuCtxSynchronize",), []),
    "cuGetErrorName": (("cuGetErrorName",), [c_int, P(c_char_p)]),
    "cuMemGetAllocationGranularity": (("cuMemGetAllocationGranularity",),
                                      [P(c_size_t), P(CUmemAllocationProp), c_int]),
    "cuMemAddressReserve": (("cuMemAddressReserve",), [P(CUdeviceptr), c_size_t, c_size_t, CUdeviceptr, c_uint64]),
    "cuMemAddressFree": (("cuMemAddressFree",), [CUdeviceptr, c_size_t]),
    "cuMemCreate": (("cuMemCreate",), [P(c_uint64), c_size_t, P(CUmemAllocationProp), c_uint64]),
    "cuMemRelease": (("cuMemRelease",), [c_uint64]),
    "cuMemMap": (("cuMemMap",), [CUdeviceptr, c_size_t, c_size_t, c_uint64, c_uint64]),
    "cuMemUnmap": (("cuMemUnmap",), [CUdeviceptr, c_size_t]),
    "cuMemSetAccess": (("cuMemSetAccess",), [CUdeviceptr, c_size_t, P(CUmemAccessDesc), c_size_t]),
    "cuMemAlloc": (("cuMemAlloc_v2",), [P(CUdeviceptr), c_size_t]),
    "cuMemFree": (("cuMemFree_v2",), [CUdeviceptr]),
    "cuMemHostAlloc": (("cuMemHostAlloc",), [P(c_void_p), c_size_t, c_uint]),
    "cuMemFreeHost": (("cuMemFreeHost",), [c_void_p]),
    "cuMemcpyHtoD": (("cuMemcpyHtoD_v2",), [CUdeviceptr, c_void_p, c_size_t]),
    "cuMemcpyDtoH": (("cuMemcpyDtoH_v2",), [c_void_p, CUdeviceptr, c_size_t]),
    "cuMemcpyDtoD": (("cuMemcpyDtoD_v2",), [CUdeviceptr, CUdeviceptr, c_size_t]),
    "cuMemcpyHtoDAsync": (("cuMemcpyHtoDAsync_v2",), [CUdeviceptr, c_void_p, c_size_t, c_void_p]),
    "cuMemcpyDtoHAsync": (("cuMemcpyDtoHAsync_v2",), [c_void_p, CUdeviceptr, c_size_t, c_void_p]),
    "cuMemcpyDtoDAsync": (("cuMemcpyDtoDAsync_v2",), [CUdeviceptr, CUdeviceptr, c_size_t, c_void_p]),
    "cuMemcpyAsync": (("cuMemcpyAsync",), [CUdeviceptr, CUdeviceptr, c_size_t, c_void_p]),
    "cuMemsetD8": (("cuMemsetD8_v2",), [CUdeviceptr, ctypes.c_ubyte, c_size_t]),
    "cuMemsetD8Async": (("cuMemsetD8Async",), [CUdeviceptr, ctypes.c_ubyte, c_size_t, c_void_p]),
    "cuStreamCreate": (("cuStreamCreate",), [P(c_void_p), c_uint]),
    "cuStreamDestroy": (("cuStreamDestroy_v2",), [c_void_p]),
    "cuStreamSynchronize": (("cuStreamSynchronize",), [c_void_p]),
    "cuStreamQuery": (("cuStreamQuery",), [c_void_p]),
    "cuEventCreate": (("cuEventCreate",), [P(c_void_p), c_uint]),
    "cuEventRecord": (("cuEventRecord",), [c_void_p, c_void_p]),
    "cuEventQuery": (("cuEventQuery",), [c_void_p]),
    "cuEventSynchronize": (("cuEventSynchronize",), [c_void_p]),
    "cuEventDestroy": (("cuEventDestroy_v2",), [c_void_p]),
    # cuda.h (13.0): #define cuEventElapsedTime cuEventElapsedTime_v2; drivers before 12.8 have only v1.
    "cuEventElapsedTime": (("cuEventElapsedTime_v2", "cuEventElapsedTime"),
                           [P(ctypes.c_float), c_void_p, c_void_p]),
    "cuModuleLoadData": (("cuModuleLoadData",), [P(c_void_p), c_void_p]),
    "cuModuleGetFunction": (("cuModuleGetFunction",), [P(c_void_p), c_void_p, c_char_p]),
    "cuLaunchKernel": (("cuLaunchKernel",), [c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint,
                                             c_uint, c_void_p, P(c_void_p), P(c_void_p)]),
}


class CudaError(RuntimeError):
    def __init__(self, call, code, name):
        super().__init__(f"{call} returned {code} ({name})")
        self.call, self.code, self.name = call, code, name


class Driver:
    """libcuda.so.1 through ctypes. `path` may be a file name or a path."""

    def __init__(self, path="libcuda.so.1"):
        self.path = path
        self.lib = ctypes.CDLL(path)  # OSError when absent
        self._fns = {}

    def has(self, name):
        try:
            self.fn(name)
            return True
        except AttributeError:
            return False

    def fn(self, name):
        if name in self._fns:
            return self._fns[name]
        symbols, argtypes = _DRIVER[name]
        for sym in symbols:
            try:
                f = getattr(self.lib, sym)
            except AttributeError:
                continue
            f.restype, f.argtypes = c_int, argtypes
            self._fns[name] = f
            return f
        raise AttributeError(f"{self.path} exports none of {', '.join(symbols)}")

    def call(self, name, *args):
        """Returns the CUresult."""
        return self.fn(name)(*args)

    def check(self, name, *args):
        r = self.fn(name)(*args)
        if r != CUDA_SUCCESS:
            raise CudaError(name, r, self.error_name(r))

    def error_name(self, code):
        s = c_char_p()
        try:
            if self.fn("cuGetErrorName")(code, ctypes.byref(s)) == CUDA_SUCCESS and s.value:
                return s.value.decode()
        except AttributeError:
            pass
        return f"CUresult {code}"

    def attribute(self, attr, dev):
        v = c_int()
        r = self.call("cuDeviceGetAttribute", ctypes.byref(v), attr, dev)
        return (v.value if r == CUDA_SUCCESS else None), r


def find_cupti(explicit=None):
    """A loadable CUPTI: `explicit`, one already mapped in this process, or the usual names/places."""
    tried = []
    cands = [explicit] if explicit else []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                if os.path.basename(path).startswith("libcupti.so") and path not in cands:
                    cands.append(path)
    except OSError:
        pass
    if not explicit:
        cands += ["libcupti.so.13", "libcupti.so.12", "libcupti.so"]
        dirs = ["/usr/local/cuda/extras/CUPTI/lib64", "/usr/local/cuda/lib64", "/usr/local/cuda/lib"]
        try:
            import importlib.util
            spec = importlib.util.find_spec("nvidia")
            # CUDA 12 wheels: nvidia/cuda_cupti/lib; CUDA 13 wheels: nvidia/cu13/lib
            for loc in (spec.submodule_search_locations or []) if spec else []:
                dirs += [os.path.join(loc, "cu13", "lib"), os.path.join(loc, "cuda_cupti", "lib")]
        except Exception:
            pass
        for d in dirs:
            if os.path.isdir(d):
                cands += sorted(os.path.join(d, f) for f in os.listdir(d) if f.startswith("libcupti.so"))
    for c in cands:
        try:
            return ctypes.CDLL(c), c, tried
        except OSError as e:
            tried.append(f"{c}: {e}")
    return None, None, tried
