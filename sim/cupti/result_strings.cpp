#include <algorithm>

#include <cupti.h>

#include "errors.h"
#include "faults.h"
#include "names.h"

namespace simcupti {
namespace {

// The enumerator names of CUptiResult, e.g. "CUPTI_ERROR_INVALID_PARAMETER",
// as the real library reports them.
constexpr IdName kResultNames[] = {
#include "result_names.inc"
};
static_assert(std::ranges::is_sorted(kResultNames, {}, &IdName::id));

}  // namespace

std::span<const IdName> result_names() {
  return kResultNames;
}

}  // namespace simcupti

// cupti_result.h: CUPTI_ERROR_INVALID_PARAMETER "if str is NULL or result is
// not a valid CUptiResult".
CUptiResult cuptiGetResultString(CUptiResult result, const char** str) {
  if (CUptiResult f = simcupti::injected("cuptiGetResultString"); f != CUPTI_SUCCESS)
    return simcupti::ret(f);
  using namespace simcupti;
  if (str == nullptr) return ret(CUPTI_ERROR_INVALID_PARAMETER);
  const char* found = find_name(kResultNames, static_cast<uint32_t>(result));
  if (found == nullptr) return ret(CUPTI_ERROR_INVALID_PARAMETER);
  *str = found;
  return CUPTI_SUCCESS;
}
