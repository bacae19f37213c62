#include "copy_streams.h"

namespace spillway {

CUresult CopyStreams::not_capturing(CUstream s) const {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = d_.cuStreamIsCapturing(s, &status);
  if (r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE)
    r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return r;
}

CUresult CopyStreams::order_after(CUstream waiter, CUstream s) {
  if (CUresult c = not_capturing(s); c != CUDA_SUCCESS) return c;
  CUresult r = CU_CALL(d_, cuEventRecord, ev_.get(), s);
  if (r == CUDA_SUCCESS) r = CU_CALL(d_, cuStreamWaitEvent, waiter, ev_.get(), 0);
  return r;
}

CUresult CopyStreams::order_after_users(CUstream waiter, const Block& b) {
  CUresult r = order_after(waiter, b.stream);
  for (CUstream u : b.users)
    if (r == CUDA_SUCCESS) r = order_after(waiter, u);
  return r;
}

CUresult CopyStreams::drain(CUstream s) {
  if (CUresult c = not_capturing(s); c != CUDA_SUCCESS) return c;
  CUresult r = CU_CALL(d_, cuEventRecord, ev_.get(), s);
  if (r == CUDA_SUCCESS) r = CU_CALL(d_, cuEventSynchronize, ev_.get());
  return r;
}

}  // namespace spillway
