// CUPTI, reached through dlopen like the driver: spillway runs (blind) where
// CUPTI is missing, and a profiler that holds CUPTI does not stop the job.
#pragma once

#include <cupti.h>

#include <string>

namespace spillway::cupti {

struct Api {
#define CUPTI_ENTRY_POINT(name) decltype(&::name) name = nullptr;
#include "cupti_entry_points.def"
#undef CUPTI_ENTRY_POINT
};

// Loads `path` (default "libcupti.so.13"). nullptr and a reason on failure.
const Api* load(const std::string& path, std::string* why);

}  // namespace spillway::cupti
