// Every exported function returns through ret() so that cuptiGetLastError
// sees each failure without each call site having to remember it.
#pragma once

#include <cupti_result.h>

namespace simcupti {

// Records `r` as the calling thread's last error unless it is CUPTI_SUCCESS,
// and returns it.
CUptiResult ret(CUptiResult r);

}  // namespace simcupti
