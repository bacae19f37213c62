// Emulation of one CUDA runtime call for CUPTI's runtime domain
// (simcuda_runtime_launch, simcuda.h). There is no simulated libcudart: this
// fires the runtime-domain callbacks a cudaLaunchKernel would, around the
// driver's cuLaunchKernel, which fires its own driver-domain callbacks inside.
#include <simcuda.h>

#include <cuda_runtime_api.h>

#include <cstring>

#include "api.h"

using namespace sim;

extern "C" CUresult simcuda_runtime_launch(CUfunction f, simcuda_dim3 grid, simcuda_dim3 block,
                                           void** args, size_t shared_mem, CUstream stream) {
  State* st = state();
  if (!st) return CUDA_ERROR_NOT_INITIALIZED;
  // The runtime call has its own correlation id; the nested driver call
  // takes the next one (api_sim.cpp), as CUPTI gives every API invocation a
  // unique id (cupti_activity.h, CUpti_ActivityAPI::correlationId).
  const uint32_t corr = st->next_correlation.fetch_add(1);
  CUcontext ctx_handle = nullptr;
  uint32_t ctx_id = 0;
  if (!context_stack().empty() && context_stack().back()) {
    ctx_handle = reinterpret_cast<CUcontext>(context_stack().back());
    ctx_id = context_stack().back()->id;
  }
  // `func` is a host stub on hardware; here the stub is the CUfunction itself.
  cudaLaunchKernel_v7000_params p{};
  p.func = reinterpret_cast<const void*>(f);
  p.gridDim = dim3(grid.x, grid.y, grid.z);
  p.blockDim = dim3(block.x, block.y, block.z);
  p.args = args;
  p.sharedMem = shared_mem;
  p.stream = reinterpret_cast<cudaStream_t>(stream);
  cudaError_t rt = cudaSuccess;
  uint64_t correlation_data = 0;
  const simbridge::Hooks* hooks = cupti_hooks();
  constexpr uint32_t kCbid = CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000;
  if (hooks && hooks->runtime_api)
    hooks->runtime_api(kCbid, false, "cudaLaunchKernel_v7000", &p, &rt, ctx_handle, ctx_id, corr,
                       &correlation_data);
  const CUresult r = cuLaunchKernel(f, grid.x, grid.y, grid.z, block.x, block.y, block.z,
                                    static_cast<unsigned>(shared_mem), stream, args, nullptr);
  // The codes this path returns have the same value in both enums
  // (driver_types.h: cudaErrorInvalidValue = 1, cudaErrorInitializationError
  // = 3, cudaErrorDeviceUninitialized = 201, cudaErrorInvalidResourceHandle =
  // 400, cudaErrorIllegalAddress = 700, cudaErrorStreamCapture* = 900-908).
  rt = static_cast<cudaError_t>(r);
  hooks = cupti_hooks();
  if (hooks && hooks->runtime_api)
    hooks->runtime_api(kCbid, true, "cudaLaunchKernel_v7000", &p, &rt, ctx_handle, ctx_id, corr,
                       &correlation_data);
  std::memset(static_cast<void*>(&p), 0xA5, sizeof p);
  return r;
}
