// The CUDA driver, reached only through this table: dlopen("libcuda.so.1")
// and cuGetProcAddress_v2 for every entry point in driver_entry_points.def.
// Nothing links libcuda, so the same binary runs on a real driver and on the
// simulator (build/sim/libcuda.so.1).
#pragma once

#include <cuda.h>

#include <string>

namespace spillway::cu {

// The one CUDA version spillway asks cuGetProcAddress for: every entry point
// gets the ABI it had in CUDA 12.8, which is also what the CUDA 13 headers
// declare for the calls spillway makes. Drivers older than 12.8 are refused.
inline constexpr int kCudaVersion = 12080;

struct Driver {
  // The member for cuMemcpyHtoDAsync is named (and typed) after the versioned
  // symbol cuda.h maps it to, cuMemcpyHtoDAsync_v2: callers write
  // d.cuMemcpyHtoDAsync(...) and the same macro applies.
#define SPILLWAY_DRIVER_ENTRY(name) decltype(&::name) name = nullptr;
#include "driver_entry_points.def"
#undef SPILLWAY_DRIVER_ENTRY
};

// Loads the driver once. Returns nullptr (and a reason in *why) if there is
// no driver, it is too old, or an entry point is missing.
const Driver* load(std::string* why);

// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)", or the number if unknown.
std::string describe(const Driver& d, CUresult r);

}  // namespace spillway::cu
