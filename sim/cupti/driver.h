// The link to the simulated driver: found in the process with dlopen, never
// linked, so the same library reports CUPTI_ERROR_NOT_INITIALIZED under any
// other driver (cupti_bridge.h).
#pragma once

#include <cupti.h>

#include "cupti_bridge.h"

namespace simcupti {

// The driver's answers, attaching our hooks on the first call. nullptr when
// libcuda.so.1 cannot be loaded or is not the simulator; a later call tries
// again, since the application may load the driver after its first CUPTI call.
const simbridge::DriverInfo* driver();

// The hooks the driver calls (callbacks.cpp, activity.cpp).
void on_api(uint32_t cbid, bool exit, const char* name, const void* params, CUresult* result,
            CUcontext ctx, uint32_t context_id, uint32_t correlation_id,
            uint64_t* correlation_data);
void on_activity(const simbridge::Activity& record);
// Runtime-domain callbacks, emulated by the driver's simcuda_runtime_launch.
void on_runtime_api(uint32_t cbid, bool exit, const char* name, const void* params, void* result,
                    CUcontext ctx, uint32_t context_id, uint32_t correlation_id,
                    uint64_t* correlation_data);

}  // namespace simcupti
