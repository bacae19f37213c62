#include "errors.h"

#include <cupti.h>

namespace simcupti {
namespace {
// cupti_activity.h, cuptiGetLastError: "the last error ... in the same host
// thread".
thread_local CUptiResult t_last_error = CUPTI_SUCCESS;
}  // namespace

CUptiResult ret(CUptiResult r) {
  if (r != CUPTI_SUCCESS) t_last_error = r;
  return r;
}

}  // namespace simcupti

// Reading resets the error to CUPTI_SUCCESS (cupti_activity.h).
CUptiResult cuptiGetLastError(void) {
  CUptiResult r = simcupti::t_last_error;
  simcupti::t_last_error = CUPTI_SUCCESS;
  return r;
}
