// cuGetProcAddress: base name + CUDA version + stream-semantics flag -> the
// entry point, as cuda.h describes it: a version newer than the driver is
// CUDA_ERROR_INVALID_VALUE; an unknown symbol, or a version older than the
// first one the sim implements for it (say cuMemcpyHtoDAsync for CUDA 3.0,
// the 32-bit v1), is CUDA_SUCCESS with a NULL pointer and the status saying
// which.
#include <cstring>

#include "api.h"
#include "variants.h"

namespace {

struct Entry {
  const char* base;
  int min_version;  // first CUDA version whose cuGetProcAddress returns this variant
  void* fn;
  void* per_thread;  // the _ptsz/_ptds variant, if any
  const char* name;  // the exported names of fn and per_thread
  const char* per_thread_name;
};

#define E(base, ver, sym) {#base, ver, reinterpret_cast<void*>(&sym), nullptr, #sym, nullptr},
#define P(base, ver, sym, pt) \
  {#base, ver, reinterpret_cast<void*>(&sym), reinterpret_cast<void*>(&pt), #sym, #pt},

// clang-format off
const Entry kEntries[] = {
    E(cuGetProcAddress, 12050, cuGetProcAddress_v2)
    E(cuInit, 2000, cuInit)
    E(cuDriverGetVersion, 2020, cuDriverGetVersion)
    E(cuDeviceGet, 2000, cuDeviceGet)
    E(cuDeviceGetCount, 2000, cuDeviceGetCount)
    E(cuDeviceGetName, 2000, cuDeviceGetName)
    E(cuDeviceTotalMem, 3020, cuDeviceTotalMem_v2)
    E(cuDeviceGetAttribute, 2000, cuDeviceGetAttribute)
    E(cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain)
    E(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease_v2)
    E(cuDevicePrimaryCtxGetState, 7000, cuDevicePrimaryCtxGetState)
    E(cuCtxGetCurrent, 4000, cuCtxGetCurrent)
    E(cuCtxSetCurrent, 4000, cuCtxSetCurrent)
    E(cuCtxPushCurrent, 4000, cuCtxPushCurrent_v2)
    E(cuCtxPopCurrent, 4000, cuCtxPopCurrent_v2)
    E(cuCtxGetDevice, 2000, cuCtxGetDevice)
    E(cuCtxSynchronize, 2000, cuCtxSynchronize)
    E(cuCtxGetStreamPriorityRange, 5050, cuCtxGetStreamPriorityRange)
    E(cuGetErrorName, 6000, cuGetErrorName)
    E(cuGetErrorString, 6000, cuGetErrorString)
    E(cuMemGetInfo, 3020, cuMemGetInfo_v2)
    E(cuMemGetAllocationGranularity, 10020, cuMemGetAllocationGranularity)
    E(cuMemGetAllocationPropertiesFromHandle, 10020, cuMemGetAllocationPropertiesFromHandle)
    E(cuMemAddressReserve, 10020, cuMemAddressReserve)
    E(cuMemAddressFree, 10020, cuMemAddressFree)
    E(cuMemCreate, 10020, cuMemCreate)
    E(cuMemRelease, 10020, cuMemRelease)
    E(cuMemMap, 10020, cuMemMap)
    E(cuMemUnmap, 10020, cuMemUnmap)
    E(cuMemSetAccess, 10020, cuMemSetAccess)
    E(cuMemGetAccess, 10020, cuMemGetAccess)
    E(cuMemAlloc, 3020, cuMemAlloc_v2)
    E(cuMemFree, 3020, cuMemFree_v2)
    E(cuMemHostAlloc, 2020, cuMemHostAlloc)
    E(cuMemAllocHost, 3020, cuMemAllocHost_v2)
    E(cuMemFreeHost, 2000, cuMemFreeHost)
    E(cuMemHostRegister, 6050, cuMemHostRegister_v2)
    E(cuMemHostUnregister, 4000, cuMemHostUnregister)
    E(cuMemHostGetDevicePointer, 3020, cuMemHostGetDevicePointer_v2)
    E(cuMemAllocManaged, 6000, cuMemAllocManaged)
    P(cuMemPrefetchAsync, 12020, cuMemPrefetchAsync_v2, cuMemPrefetchAsync_v2_ptsz)
    E(cuMemAdvise, 12020, cuMemAdvise_v2)
    E(cuMemRangeGetAttribute, 8000, cuMemRangeGetAttribute)
    E(cuPointerGetAttribute, 4000, cuPointerGetAttribute)
    P(cuMemcpy, 4000, cuMemcpy, cuMemcpy_ptds)
    P(cuMemcpyAsync, 4000, cuMemcpyAsync, cuMemcpyAsync_ptsz)
    P(cuMemcpyHtoD, 3020, cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds)
    P(cuMemcpyDtoH, 3020, cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds)
    P(cuMemcpyDtoD, 3020, cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds)
    P(cuMemcpyHtoDAsync, 3020, cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz)
    P(cuMemcpyDtoHAsync, 3020, cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz)
    P(cuMemcpyDtoDAsync, 3020, cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz)
    P(cuMemsetD8, 3020, cuMemsetD8_v2, cuMemsetD8_v2_ptds)
    P(cuMemsetD16, 3020, cuMemsetD16_v2, cuMemsetD16_v2_ptds)
    P(cuMemsetD32, 3020, cuMemsetD32_v2, cuMemsetD32_v2_ptds)
    P(cuMemsetD8Async, 3020, cuMemsetD8Async, cuMemsetD8Async_ptsz)
    P(cuMemsetD16Async, 3020, cuMemsetD16Async, cuMemsetD16Async_ptsz)
    P(cuMemsetD32Async, 3020, cuMemsetD32Async, cuMemsetD32Async_ptsz)
    E(cuStreamCreate, 2000, cuStreamCreate)
    E(cuStreamCreateWithPriority, 5050, cuStreamCreateWithPriority)
    E(cuStreamDestroy, 4000, cuStreamDestroy_v2)
    E(cuStreamGetFlags, 5050, cuStreamGetFlags)
    E(cuStreamGetPriority, 5050, cuStreamGetPriority)
    P(cuStreamGetId, 12000, cuStreamGetId, cuStreamGetId_ptsz)
    P(cuStreamSynchronize, 2000, cuStreamSynchronize, cuStreamSynchronize_ptsz)
    P(cuStreamQuery, 2000, cuStreamQuery, cuStreamQuery_ptsz)
    P(cuStreamWaitEvent, 3020, cuStreamWaitEvent, cuStreamWaitEvent_ptsz)
    P(cuLaunchHostFunc, 10000, cuLaunchHostFunc, cuLaunchHostFunc_ptsz)
    E(cuEventCreate, 2000, cuEventCreate)
    E(cuEventDestroy, 4000, cuEventDestroy_v2)
    P(cuEventRecord, 2000, cuEventRecord, cuEventRecord_ptsz)
    P(cuEventRecordWithFlags, 11010, cuEventRecordWithFlags, cuEventRecordWithFlags_ptsz)
    E(cuEventQuery, 2000, cuEventQuery)
    E(cuEventSynchronize, 2000, cuEventSynchronize)
    E(cuEventElapsedTime, 12080, cuEventElapsedTime_v2)
    E(cuFuncGetParamInfo, 12040, cuFuncGetParamInfo)
    E(cuKernelGetParamInfo, 12040, cuKernelGetParamInfo)
    E(cuFuncGetName, 12030, cuFuncGetName)
    E(cuKernelGetName, 12030, cuKernelGetName)
    E(cuKernelGetFunction, 12000, cuKernelGetFunction)
    P(cuLaunchKernel, 4000, cuLaunchKernel, cuLaunchKernel_ptsz)
    P(cuLaunchKernelEx, 11060, cuLaunchKernelEx, cuLaunchKernelEx_ptsz)
    P(cuLaunchCooperativeKernel, 9000, cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz)
    P(cuStreamBeginCapture, 10010, cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz)
    P(cuStreamEndCapture, 10000, cuStreamEndCapture, cuStreamEndCapture_ptsz)
    P(cuStreamIsCapturing, 10000, cuStreamIsCapturing, cuStreamIsCapturing_ptsz)
    P(cuStreamGetCaptureInfo, 12030, cuStreamGetCaptureInfo_v3, cuStreamGetCaptureInfo_v3_ptsz)
    E(cuThreadExchangeStreamCaptureMode, 10010, cuThreadExchangeStreamCaptureMode)
    E(cuGraphInstantiate, 12000, cuGraphInstantiateWithFlags)
    E(cuGraphInstantiateWithFlags, 11040, cuGraphInstantiateWithFlags)
    P(cuGraphLaunch, 10000, cuGraphLaunch, cuGraphLaunch_ptsz)
    E(cuGraphExecDestroy, 10000, cuGraphExecDestroy)
    E(cuGraphDestroy, 10000, cuGraphDestroy)
};
// clang-format on
#undef E
#undef P

CUresult lookup(const char* symbol, void** pfn, int version, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status) {
  auto set_status = [&](CUdriverProcAddressQueryResult s) {
    if (status) *status = s;
  };
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  if (flags > CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) return CUDA_ERROR_INVALID_VALUE;
  if (version > CUDA_VERSION)
    return sim::refuse(CUDA_ERROR_INVALID_VALUE,
                       "cuGetProcAddress: version %d is newer than the driver (%d)", version,
                       CUDA_VERSION);
  *pfn = nullptr;
  for (const Entry& e : kEntries) {
    if (std::strcmp(e.base, symbol) != 0) continue;
    if (version < e.min_version) {
      set_status(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
      return CUDA_SUCCESS;
    }
    const bool per_thread = flags == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    *pfn = per_thread && e.per_thread ? e.per_thread : e.fn;
    set_status(CU_GET_PROC_ADDRESS_SUCCESS);
    return CUDA_SUCCESS;
  }
  sim::refuse(CUDA_SUCCESS, "cuGetProcAddress: %s is not simulated", symbol);
  set_status(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  return CUDA_SUCCESS;
}

}  // namespace

namespace sim::api {

std::vector<std::string_view> entry_point_names() {
  std::vector<std::string_view> names;
  for (const Entry& e : kEntries) {
    names.emplace_back(e.name);
    if (e.per_thread_name) names.emplace_back(e.per_thread_name);
  }
  return names;
}

}  // namespace sim::api

extern "C" CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                                cuuint64_t flags,
                                                CUdriverProcAddressQueryResult* symbolStatus) {
  // Callable before cuInit (cuda.h), like the driver's own loader path.
  cuGetProcAddress_v2_params p_{symbol, pfn, cudaVersion, flags, symbolStatus};
  return SIM_INVOKE(cuGetProcAddress_v2, p_,
                    [&] { return lookup(symbol, pfn, cudaVersion, flags, symbolStatus); });
}
