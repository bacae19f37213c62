// The CUDA driver, reached only through this table: dlopen("libcuda.so.1")
// and cuGetProcAddress_v2 for every entry point in driver_entry_points.def.
// Nothing links libcuda, so the same binary runs on a real driver and on the
// simulator (build/sim/libcuda.so.1).
#pragma once

#include <cuda.h>

#include <fmt/format.h>

#include <string>
#include <type_traits>

namespace spillway::cu {

// The one CUDA version spillway asks cuGetProcAddress for: every entry point
// gets the ABI it had in CUDA 12.8, which is also what the CUDA 13 headers
// declare for the calls spillway makes. Drivers older than 12.8 are refused.
inline constexpr int kCudaVersion = 12080;

struct Driver {
  // The member for cuMemcpyHtoDAsync is named (and typed) after the versioned
  // symbol cuda.h maps it to, cuMemcpyHtoDAsync_v2: callers write
  // d.cuMemcpyHtoDAsync(...) and the same macro applies.
#define DRIVER_ENTRY_POINT(name) decltype(&::name) name = nullptr;
#include "driver_entry_points.def"
#undef DRIVER_ENTRY_POINT
};

// Loads the driver once. Returns nullptr (and a reason in *why) if there is
// no driver, it is too old, or an entry point is missing.
const Driver* load(std::string* why);

// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)", or the number if unknown.
std::string describe(const Driver& d, CUresult r);

// Logs a failed call as "cuMemMap(0x7f.., 2097152, 0, 0xa110c003, 0) failed:
// CUDA_ERROR_INVALID_VALUE (invalid value)" and returns its result.
void log_failure(const Driver& d, const std::string& call, CUresult r);

// Pointers and device addresses print in hex, other values as they are.
// (CUdeviceptr is an integer: values past 2^40, far above any size spillway
// passes, are taken to be addresses.)
template <class T>
std::string loggable(T v) {
  if constexpr (std::is_pointer_v<T>) {
    return fmt::format("{}", static_cast<const void*>(v));
  } else if constexpr (std::is_same_v<T, CUmemLocation>) {
    // cuMemPrefetchAsync's destination.
    switch (v.type) {
      case CU_MEM_LOCATION_TYPE_DEVICE:
        return fmt::format("{{device {}}}", v.id);
      case CU_MEM_LOCATION_TYPE_HOST:
        return "{host}";
      case CU_MEM_LOCATION_TYPE_HOST_NUMA:
        return fmt::format("{{host numa {}}}", v.id);
      default:
        return fmt::format("{{type {}, id {}}}", static_cast<int>(v.type), v.id);
    }
  } else if constexpr (std::is_integral_v<T>) {
    const bool address = sizeof(T) == 8 && static_cast<uint64_t>(v) >= (uint64_t{1} << 40);
    return address ? fmt::format("{:#x}", v) : fmt::format("{}", v);
  } else {
    return fmt::format("{}", v);
  }
}

template <class... A>
CUresult checked(const Driver& d, const char* name, CUresult r, A... args) {
  if (r != CUDA_SUCCESS) {
    std::string call = std::string(name) + "(";
    ((call += fmt::format("{}, ", loggable(args))), ...);
    if (sizeof...(A)) call.resize(call.size() - 2);
    log_failure(d, call + ")", r);
  }
  return r;
}

}  // namespace spillway::cu

// A driver call whose failure is logged with its arguments.
#define CU_CALL(d, fn, ...) ::spillway::cu::checked((d), #fn, (d).fn(__VA_ARGS__), __VA_ARGS__)

namespace spillway::cu {}  // namespace spillway::cu
