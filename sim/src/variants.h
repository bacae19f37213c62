// The _ptsz / _ptds entry points. cuda.h declares them only when it is
// compiled for per-thread default streams; declare each here with its base
// entry point's signature.
#pragma once

#include <cuda.h>

#define SIM_DECLARE_VARIANT(base, variant) extern "C" decltype(base) variant;

// clang-format off
SIM_DECLARE_VARIANT(cuMemcpy, cuMemcpy_ptds)
SIM_DECLARE_VARIANT(cuMemcpyAsync, cuMemcpyAsync_ptsz)
SIM_DECLARE_VARIANT(cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds)
SIM_DECLARE_VARIANT(cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds)
SIM_DECLARE_VARIANT(cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds)
SIM_DECLARE_VARIANT(cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz)
SIM_DECLARE_VARIANT(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz)
SIM_DECLARE_VARIANT(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz)
SIM_DECLARE_VARIANT(cuMemsetD8_v2, cuMemsetD8_v2_ptds)
SIM_DECLARE_VARIANT(cuMemsetD16_v2, cuMemsetD16_v2_ptds)
SIM_DECLARE_VARIANT(cuMemsetD32_v2, cuMemsetD32_v2_ptds)
SIM_DECLARE_VARIANT(cuMemsetD8Async, cuMemsetD8Async_ptsz)
SIM_DECLARE_VARIANT(cuMemsetD16Async, cuMemsetD16Async_ptsz)
SIM_DECLARE_VARIANT(cuMemsetD32Async, cuMemsetD32Async_ptsz)
SIM_DECLARE_VARIANT(cuStreamSynchronize, cuStreamSynchronize_ptsz)
SIM_DECLARE_VARIANT(cuStreamQuery, cuStreamQuery_ptsz)
SIM_DECLARE_VARIANT(cuStreamWaitEvent, cuStreamWaitEvent_ptsz)
SIM_DECLARE_VARIANT(cuEventRecord, cuEventRecord_ptsz)
SIM_DECLARE_VARIANT(cuEventRecordWithFlags, cuEventRecordWithFlags_ptsz)
SIM_DECLARE_VARIANT(cuLaunchHostFunc, cuLaunchHostFunc_ptsz)
SIM_DECLARE_VARIANT(cuStreamGetId, cuStreamGetId_ptsz)
SIM_DECLARE_VARIANT(cuLaunchKernel, cuLaunchKernel_ptsz)
SIM_DECLARE_VARIANT(cuLaunchKernelEx, cuLaunchKernelEx_ptsz)
SIM_DECLARE_VARIANT(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz)
SIM_DECLARE_VARIANT(cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz)
SIM_DECLARE_VARIANT(cuStreamEndCapture, cuStreamEndCapture_ptsz)
SIM_DECLARE_VARIANT(cuStreamIsCapturing, cuStreamIsCapturing_ptsz)
SIM_DECLARE_VARIANT(cuStreamGetCaptureInfo_v3, cuStreamGetCaptureInfo_v3_ptsz)
SIM_DECLARE_VARIANT(cuGraphLaunch, cuGraphLaunch_ptsz)
SIM_DECLARE_VARIANT(cuMemPrefetchAsync_v2, cuMemPrefetchAsync_v2_ptsz)
// clang-format on
