// Timestamps and ids, answered by the driver so that they match what its
// callbacks and activity records carry.

#include "driver.h"
#include "errors.h"
#include "faults.h"

using simcupti::ret;

// Virtual time: the clock the activity records' start and end come from
// ("normalized to correspond with the start and end timestamps",
// cupti_activity.h).
CUptiResult cuptiGetTimestamp(uint64_t* timestamp) {
  if (CUptiResult f = simcupti::injected("cuptiGetTimestamp"); f != CUPTI_SUCCESS)
    return simcupti::ret(f);
  const simbridge::DriverInfo* d = simcupti::driver();
  if (d == nullptr) return ret(CUPTI_ERROR_NOT_INITIALIZED);
  if (timestamp == nullptr) return ret(CUPTI_ERROR_INVALID_PARAMETER);
  *timestamp = d->now_ns();
  return CUPTI_SUCCESS;
}

CUptiResult cuptiGetContextId(CUcontext context, uint32_t* contextId) {
  if (CUptiResult f = simcupti::injected("cuptiGetContextId"); f != CUPTI_SUCCESS)
    return simcupti::ret(f);
  const simbridge::DriverInfo* d = simcupti::driver();
  if (d == nullptr) return ret(CUPTI_ERROR_NOT_INITIALIZED);
  if (contextId == nullptr) return ret(CUPTI_ERROR_INVALID_PARAMETER);
  if (context == nullptr) return ret(CUPTI_ERROR_INVALID_CONTEXT);
  const uint32_t id = d->context_id(context);
  if (id == 0) return ret(CUPTI_ERROR_INVALID_CONTEXT);
  *contextId = id;
  return CUPTI_SUCCESS;
}

// `context` may be null ("Typically this parameter should be null"); the
// driver checks the stream against it when it is not.
CUptiResult cuptiGetStreamId(CUcontext context, CUstream stream, uint32_t* streamId) {
  if (CUptiResult f = simcupti::injected("cuptiGetStreamId"); f != CUPTI_SUCCESS)
    return simcupti::ret(f);
  const simbridge::DriverInfo* d = simcupti::driver();
  if (d == nullptr) return ret(CUPTI_ERROR_NOT_INITIALIZED);
  if (streamId == nullptr) return ret(CUPTI_ERROR_INVALID_PARAMETER);
  const uint32_t id = d->stream_id(context, stream);
  if (id == 0) return ret(CUPTI_ERROR_INVALID_STREAM);
  *streamId = id;
  return CUPTI_SUCCESS;
}

// A null context means the calling thread's current one (cupti_activity.h).
CUptiResult cuptiGetDeviceId(CUcontext context, uint32_t* deviceId) {
  const simbridge::DriverInfo* d = simcupti::driver();
  if (d == nullptr) return ret(CUPTI_ERROR_NOT_INITIALIZED);
  if (deviceId == nullptr) return ret(CUPTI_ERROR_INVALID_PARAMETER);
  const uint32_t id = d->device_id(context);
  if (id == UINT32_MAX) return ret(CUPTI_ERROR_INVALID_DEVICE);
  *deviceId = id;
  return CUPTI_SUCCESS;
}
