#include <algorithm>

#include <cupti.h>

#include "errors.h"
#include "names.h"

namespace simcupti {
namespace {

constexpr IdName kDriverNames[] = {
#include "driver_cbid_names.inc"
};
constexpr IdName kRuntimeNames[] = {
#include "runtime_cbid_names.inc"
};
static_assert(std::ranges::is_sorted(kDriverNames, {}, &IdName::id));
static_assert(std::ranges::is_sorted(kRuntimeNames, {}, &IdName::id));

}  // namespace

const char* find_name(std::span<const IdName> table, uint32_t id) {
  auto it = std::ranges::lower_bound(table, id, {}, &IdName::id);
  return it != table.end() && it->id == id ? it->name : nullptr;
}

const char* driver_api_name(uint32_t cbid) {
  return find_name(kDriverNames, cbid);
}

const char* runtime_api_name(uint32_t cbid) {
  return find_name(kRuntimeNames, cbid);
}

}  // namespace simcupti

// cupti_callbacks.h: "Names are available only for the DRIVER and RUNTIME
// domains". Names are the enumerator suffixes, version tags included
// ("cudaLaunchKernel_v7000"), which is what the real library returns.
CUptiResult cuptiGetCallbackName(CUpti_CallbackDomain domain, uint32_t cbid, const char** name) {
  using namespace simcupti;
  if (name == nullptr) return ret(CUPTI_ERROR_INVALID_PARAMETER);
  *name = nullptr;
  const char* found = nullptr;
  if (domain == CUPTI_CB_DOMAIN_DRIVER_API) found = find_name(kDriverNames, cbid);
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) found = find_name(kRuntimeNames, cbid);
  if (found == nullptr) return ret(CUPTI_ERROR_INVALID_PARAMETER);
  *name = found;
  return CUPTI_SUCCESS;
}
