// Id-to-name tables generated from the toolkit headers (see CMakeLists.txt).
#pragma once

#include <cstdint>
#include <span>

namespace simcupti {

struct IdName {
  uint32_t id;
  const char* name;
};

// The entry for `id` in a table sorted by id, or nullptr.
const char* find_name(std::span<const IdName> table, uint32_t id);

// "cuLaunchKernel" for CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel; nullptr for an
// id the header does not define. Static storage.
const char* driver_api_name(uint32_t cbid);
// The same for CUPTI_RUNTIME_TRACE_CBID_* ("cudaLaunchKernel_v7000").
const char* runtime_api_name(uint32_t cbid);
// Every CUptiResult and its enumerator name ("CUPTI_ERROR_UNKNOWN"), by id.
std::span<const IdName> result_names();

}  // namespace simcupti
