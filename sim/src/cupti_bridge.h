// The private contract between the simulated driver (libcuda.so.1) and the
// simulated CUPTI (libcupti.so.13). On hardware CUPTI hooks the driver from
// the inside; here the driver exports one sim-only symbol,
// `simcuda_cupti_attach`, that the CUPTI stand-in resolves with dlsym and
// calls once to install its hooks. Neither library is usable with the real
// counterpart of the other: the CUPTI stand-in reports
// CUPTI_ERROR_NOT_INITIALIZED when the driver is not the simulator.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda.h>

namespace simbridge {

inline constexpr int kVersion = 2;

// A device-side record, produced by a stream worker when an operation
// completes. Timestamps are virtual nanoseconds (the sim's clock).
struct Activity {
  enum class Kind : uint8_t { kKernel, kMemcpy, kMemset };
  Kind kind;
  uint64_t start_ns;
  uint64_t end_ns;
  uint32_t correlation_id;
  uint32_t device_id;
  uint32_t context_id;
  uint32_t stream_id;
  const char* name;   // kernel name (static storage for the kernel's lifetime), or nullptr
  uint64_t bytes;     // memcpy / memset
  uint8_t copy_kind;  // CUpti_ActivityMemcpyKind
  uint8_t src_kind;   // CUpti_ActivityMemoryKind
  uint8_t dst_kind;   // CUpti_ActivityMemoryKind
  uint32_t value;     // memset value
  unsigned grid[3];
  unsigned block[3];
};

// Called by the driver on the calling thread at API enter and exit. `params`
// points to the generated_cuda_meta.h struct for `cbid` and is valid only for
// the duration of the call (the driver poisons it afterwards). `result` is
// the return value slot (meaningful at exit). `correlation_data` is the
// per-call uint64 slot CUPTI passes to the subscriber at enter and exit.
using ApiHook = void (*)(uint32_t cbid, bool exit, const char* name, const void* params,
                         CUresult* result, CUcontext ctx, uint32_t context_id,
                         uint32_t correlation_id, uint64_t* correlation_data);

// The runtime domain, emulated by simcuda_runtime_launch (there is no
// simulated libcudart): same contract as ApiHook, with a runtime callback id
// (cupti_runtime_cbid.h), a generated_cuda_runtime_api_meta.h struct, and
// `result` pointing to a cudaError_t.
using RuntimeHook = void (*)(uint32_t cbid, bool exit, const char* name, const void* params,
                             void* result, CUcontext ctx, uint32_t context_id,
                             uint32_t correlation_id, uint64_t* correlation_data);

// Called from a stream worker thread when a device operation completes.
using ActivityHook = void (*)(const Activity& record);

struct Hooks {
  int version;
  ApiHook api;
  ActivityHook activity;
  RuntimeHook runtime_api;
};

// Reported back to CUPTI so it can answer cuptiGetTimestamp / id queries.
// A null context means the calling thread's current one (cupti_activity.h:
// the context argument is "typically null").
struct DriverInfo {
  uint64_t (*now_ns)();                                   // calling thread's virtual time
  uint32_t (*context_id)(CUcontext ctx);                  // 0 if unknown
  uint32_t (*stream_id)(CUcontext ctx, CUstream stream);  // 0 if unknown
  uint32_t (*device_id)(CUcontext ctx);                   // UINT32_MAX if unknown
};

}  // namespace simbridge

// Exported by the simulated libcuda.so.1. Installs (or, with nullptr, removes)
// the hooks; returns false on a version mismatch.
extern "C" bool simcuda_cupti_attach(const simbridge::Hooks* hooks, simbridge::DriverInfo* info);
