// Initialization, devices, primary contexts and error strings.
#include <cstdio>
#include <cstring>

#include "api.h"
#include "graph.h"
#include "memory.h"

using namespace sim;

namespace {

CUresult check_device(CUdevice dev) {
  State* st = state();
  if (!st) return CUDA_ERROR_NOT_INITIALIZED;
  if (dev < 0 || dev >= st->config.device_count)
    return refuse(CUDA_ERROR_INVALID_DEVICE, "no device %d", dev);
  return CUDA_SUCCESS;
}

// An H100 SXM as cuDeviceGetAttribute reports it, plus the VMM and
// host-NUMA facts spillway depends on (settable through SIMCUDA_*).
CUresult attribute(int* out, CUdevice_attribute a, CUdevice dev) {
  if (!out) return refuse(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetAttribute: null output");
  if (CUresult e = check_device(dev); e != CUDA_SUCCESS) return e;
  const Config& c = state()->config;
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      *out = 9;
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      *out = 0;
      break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      *out = 132;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      *out = 1024;
      break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
      *out = 32;
      break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
      *out = 2;
      break;  // one per direction
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
      *out = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
      *out = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
      *out = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
      *out = c.concurrent_managed;
      break;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS:
      *out = 0;
      break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      *out = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      *out = c.host_numa_vmm;
      break;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID:
      *out = 0;
      break;
    case CU_DEVICE_ATTRIBUTE_NUMA_CONFIG:
      *out = CU_DEVICE_NUMA_CONFIG_NONE;
      break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
      *out = 0x18 + dev;
      break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
      *out = 0;
      break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
      *out = 0;
      break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
      *out = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
      *out = 0;
      break;  // not modeled
    case CU_DEVICE_ATTRIBUTE_INTEGRATED:
      *out = 0;
      break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE:
      *out = 50 << 20;
      break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH:
      *out = 5120;
      break;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED:
      *out = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
      *out = 1;
      break;
    default:
      return refuse(CUDA_ERROR_INVALID_VALUE,
                    "cuDeviceGetAttribute: attribute %d is not modeled by the sim",
                    static_cast<int>(a));
  }
  return CUDA_SUCCESS;
}

CUresult primary_retain(CUcontext* out, CUdevice dev) {
  if (!out) return refuse(CUDA_ERROR_INVALID_VALUE, "cuDevicePrimaryCtxRetain: null");
  if (CUresult e = check_device(dev); e != CUDA_SUCCESS) return e;
  Context* ctx = state()->primary[static_cast<size_t>(dev)].get();
  ctx->retain_count.fetch_add(1);
  *out = reinterpret_cast<CUcontext>(ctx);
  return CUDA_SUCCESS;
}

CUresult primary_release(CUdevice dev) {
  if (CUresult e = check_device(dev); e != CUDA_SUCCESS) return e;
  Context* ctx = state()->primary[static_cast<size_t>(dev)].get();
  int expected = ctx->retain_count.load();
  do {
    if (expected <= 0)
      return refuse(CUDA_ERROR_INVALID_CONTEXT, "cuDevicePrimaryCtxRelease: not retained");
  } while (!ctx->retain_count.compare_exchange_weak(expected, expected - 1));
  return CUDA_SUCCESS;
}

CUresult set_current(CUcontext handle) {
  if (!state()) return CUDA_ERROR_NOT_INITIALIZED;
  auto& stack = context_stack();
  Context* ctx = nullptr;
  if (handle) {
    ctx = context_from_handle(handle);
    if (!ctx)
      return refuse(CUDA_ERROR_INVALID_CONTEXT, "cuCtxSetCurrent: unknown context %p", handle);
  }
  // cuda.h: replaces the top of the stack (pushes when the stack is empty).
  if (stack.empty())
    stack.push_back(ctx);
  else
    stack.back() = ctx;
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuInit(unsigned int Flags) {
  cuInit_params p_{Flags};
  return SIM_INVOKE(cuInit, p_, [&] {
    if (Flags != 0) return refuse(CUDA_ERROR_INVALID_VALUE, "cuInit: flags must be 0");
    return init_state();
  });
}

CUresult CUDAAPI cuDriverGetVersion(int* driverVersion) {
  cuDriverGetVersion_params p_{driverVersion};
  return SIM_INVOKE(cuDriverGetVersion, p_, [&] {
    if (!driverVersion) return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = CUDA_VERSION;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  cuDeviceGet_params p_{device, ordinal};
  return SIM_INVOKE(cuDeviceGet, p_, [&] {
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult e = check_device(ordinal); e != CUDA_SUCCESS) return e;
    *device = ordinal;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGetCount(int* count) {
  cuDeviceGetCount_params p_{count};
  return SIM_INVOKE(cuDeviceGetCount, p_, [&] {
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    if (!state()) return CUDA_ERROR_NOT_INITIALIZED;
    *count = state()->config.device_count;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  cuDeviceGetName_params p_{name, len, dev};
  return SIM_INVOKE(cuDeviceGetName, p_, [&] {
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult e = check_device(dev); e != CUDA_SUCCESS) return e;
    std::snprintf(name, static_cast<size_t>(len), "Simulated H100 SXM (simcuda)");
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  cuDeviceTotalMem_v2_params p_{bytes, dev};
  return SIM_INVOKE(cuDeviceTotalMem_v2, p_, [&] {
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult e = check_device(dev); e != CUDA_SUCCESS) return e;
    *bytes = state()->config.device_memory;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  cuDeviceGetAttribute_params p_{pi, attrib, dev};
  return SIM_INVOKE(cuDeviceGetAttribute, p_, [&] { return attribute(pi, attrib, dev); });
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  cuDevicePrimaryCtxRetain_params p_{pctx, dev};
  return SIM_INVOKE(cuDevicePrimaryCtxRetain, p_, [&] { return primary_retain(pctx, dev); });
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  cuDevicePrimaryCtxRelease_v2_params p_{dev};
  return SIM_INVOKE(cuDevicePrimaryCtxRelease_v2, p_, [&] { return primary_release(dev); });
}

CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  cuDevicePrimaryCtxGetState_params p_{dev, flags, active};
  return SIM_INVOKE(cuDevicePrimaryCtxGetState, p_, [&] {
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult e = check_device(dev); e != CUDA_SUCCESS) return e;
    Context* ctx = state()->primary[static_cast<size_t>(dev)].get();
    *flags = ctx->flags;
    *active = ctx->retain_count.load() > 0;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext* pctx) {
  cuCtxGetCurrent_params p_{pctx};
  return SIM_INVOKE(cuCtxGetCurrent, p_, [&] {
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!state()) return CUDA_ERROR_NOT_INITIALIZED;
    auto& stack = context_stack();
    *pctx = stack.empty() ? nullptr : reinterpret_cast<CUcontext>(stack.back());
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  cuCtxSetCurrent_params p_{ctx};
  return SIM_INVOKE(cuCtxSetCurrent, p_, [&] { return set_current(ctx); });
}

CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx) {
  cuCtxPushCurrent_v2_params p_{ctx};
  return SIM_INVOKE(cuCtxPushCurrent_v2, p_, [&] {
    if (!state()) return CUDA_ERROR_NOT_INITIALIZED;
    Context* c = context_from_handle(ctx);
    if (!c) return refuse(CUDA_ERROR_INVALID_CONTEXT, "cuCtxPushCurrent: unknown context %p", ctx);
    context_stack().push_back(c);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* pctx) {
  cuCtxPopCurrent_v2_params p_{pctx};
  return SIM_INVOKE(cuCtxPopCurrent_v2, p_, [&] {
    if (!state()) return CUDA_ERROR_NOT_INITIALIZED;
    auto& stack = context_stack();
    if (stack.empty() || !stack.back())
      return refuse(CUDA_ERROR_INVALID_CONTEXT, "cuCtxPopCurrent: no current context");
    if (pctx) *pctx = reinterpret_cast<CUcontext>(stack.back());
    stack.pop_back();
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice* device) {
  cuCtxGetDevice_params p_{device};
  return SIM_INVOKE(cuCtxGetDevice, p_, [&] {
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    SIM_CTX(ctx);
    *device = ctx->device;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxSynchronize(void) {
  struct {
    char none;  // cuCtxSynchronize takes no parameters: CUPTI passes no struct
  } p_{};
  return api::call(
      CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize, "cuCtxSynchronize", p_, api::Cost::kApi, [&] {
        SIM_CTX(ctx);
        if (CUresult e = graph::check_context_wait(ctx, "cuCtxSynchronize"); e != CUDA_SUCCESS)
          return e;
        return stream::synchronize_context(ctx);
      });
}

CUresult CUDAAPI cuCtxGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  cuCtxGetStreamPriorityRange_params p_{leastPriority, greatestPriority};
  return SIM_INVOKE(cuCtxGetStreamPriorityRange, p_, [&] {
    SIM_NEED_CTX();
    if (leastPriority) *leastPriority = 0;
    if (greatestPriority) *greatestPriority = -5;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemGetInfo_v2(size_t* free, size_t* total) {
  cuMemGetInfo_v2_params p_{free, total};
  return SIM_INVOKE(cuMemGetInfo_v2, p_, [&] {
    SIM_CTX(ctx);
    return mem::get_info(ctx->device, free, total);
  });
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char** pStr) {
  cuGetErrorName_params p_{error, pStr};
  return SIM_INVOKE(cuGetErrorName, p_, [&] {
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    const char* n = errors::name(error);
    *pStr = n;
    return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  });
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char** pStr) {
  cuGetErrorString_params p_{error, pStr};
  return SIM_INVOKE(cuGetErrorString, p_, [&] {
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    const char* d = errors::description(error);
    *pStr = d;
    return d ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  });
}

}  // extern "C"
