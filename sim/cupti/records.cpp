#include "records.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

#include "errors.h"
#include "faults.h"

namespace simcupti {
namespace {

// Kernel names must outlive the kernel (records can be read long after it is
// unregistered), so they are copied once and kept for the process. Leaked on
// purpose: stream workers may still complete kernels during exit.
const char* intern(const char* name) {
  if (name == nullptr) return nullptr;
  static constinit std::mutex mu;
  static auto* names = new std::set<std::string, std::less<>>;
  std::lock_guard lock(mu);
  auto it = names->find(std::string_view(name));
  if (it == names->end()) it = names->emplace(name).first;
  return it->c_str();
}

// cupti_activity.h, CUpti_ActivityKernel10::gridId: "Each kernel is assigned
// a unique grid ID at runtime."
std::atomic<int64_t> g_next_grid_id{1};

void encode_kernel(const simbridge::Activity& a, CUpti_ActivityKind kind, void* out) {
  CUpti_ActivityKernel10 r{};
  r.kind = kind;
  r.start = a.start_ns;
  r.end = a.end_ns;
  r.completed = a.end_ns;  // no child kernels: done when it ends
  r.queued = CUPTI_TIMESTAMP_UNKNOWN;
  r.submitted = CUPTI_TIMESTAMP_UNKNOWN;
  r.deviceId = a.device_id;
  r.contextId = a.context_id;
  r.streamId = a.stream_id;
  r.gridX = static_cast<int32_t>(a.grid[0]);
  r.gridY = static_cast<int32_t>(a.grid[1]);
  r.gridZ = static_cast<int32_t>(a.grid[2]);
  r.blockX = static_cast<int32_t>(a.block[0]);
  r.blockY = static_cast<int32_t>(a.block[1]);
  r.blockZ = static_cast<int32_t>(a.block[2]);
  r.correlationId = a.correlation_id;
  r.gridId = g_next_grid_id.fetch_add(1, std::memory_order_relaxed);
  r.name = intern(a.name);
  r.launchType = CUPTI_ACTIVITY_LAUNCH_TYPE_REGULAR;
  r.channelType = CUPTI_CHANNEL_TYPE_COMPUTE;
  std::memcpy(out, &r, sizeof r);
}

void encode_memcpy(const simbridge::Activity& a, void* out) {
  CUpti_ActivityMemcpy6 r{};
  r.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
  r.copyKind = a.copy_kind;
  r.srcKind = a.src_kind;
  r.dstKind = a.dst_kind;
  r.bytes = a.bytes;
  r.start = a.start_ns;
  r.end = a.end_ns;
  r.deviceId = a.device_id;
  r.contextId = a.context_id;
  r.streamId = a.stream_id;
  r.correlationId = a.correlation_id;
  r.channelType = CUPTI_CHANNEL_TYPE_ASYNC_MEMCPY;
  r.copyCount = 1;  // "For other memcpy operations, this field will be 1."
  std::memcpy(out, &r, sizeof r);
}

void encode_memset(const simbridge::Activity& a, void* out) {
  CUpti_ActivityMemset4 r{};
  r.kind = CUPTI_ACTIVITY_KIND_MEMSET;
  r.value = a.value;
  r.bytes = a.bytes;
  r.start = a.start_ns;
  r.end = a.end_ns;
  r.deviceId = a.device_id;
  r.contextId = a.context_id;
  r.streamId = a.stream_id;
  r.correlationId = a.correlation_id;
  r.memoryKind = a.dst_kind != CUPTI_ACTIVITY_MEMORY_KIND_UNKNOWN
                     ? a.dst_kind
                     : static_cast<uint16_t>(CUPTI_ACTIVITY_MEMORY_KIND_DEVICE);
  r.channelType = CUPTI_CHANNEL_TYPE_COMPUTE;
  std::memcpy(out, &r, sizeof r);
}

}  // namespace

size_t record_size(CUpti_ActivityKind kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      return sizeof(CUpti_ActivityKernel10);
    case CUPTI_ACTIVITY_KIND_MEMCPY:
      return sizeof(CUpti_ActivityMemcpy6);
    case CUPTI_ACTIVITY_KIND_MEMSET:
      return sizeof(CUpti_ActivityMemset4);
    default:
      return 0;
  }
}

void encode(const simbridge::Activity& a, CUpti_ActivityKind kind, void* out) {
  switch (a.kind) {
    case simbridge::Activity::Kind::kKernel:
      encode_kernel(a, kind, out);
      break;
    case simbridge::Activity::Kind::kMemcpy:
      encode_memcpy(a, out);
      break;
    case simbridge::Activity::Kind::kMemset:
      encode_memset(a, out);
      break;
  }
}

}  // namespace simcupti

// Buffers are filled from the first ACTIVITY_RECORD_ALIGNMENT-aligned byte
// (buffers.cpp), so iteration starts there too. A record whose kind this
// library does not write, or that runs past validBufferSizeBytes, is "either
// incomplete or invalid" (cupti_activity.h): CUPTI_ERROR_INVALID_KIND.
CUptiResult cuptiActivityGetNextRecord(uint8_t* buffer, size_t validBufferSizeBytes,
                                       CUpti_Activity** record) {
  if (CUptiResult f = simcupti::injected("cuptiActivityGetNextRecord"); f != CUPTI_SUCCESS)
    return simcupti::ret(f);
  using namespace simcupti;
  if (buffer == nullptr || record == nullptr) return ret(CUPTI_ERROR_INVALID_PARAMETER);
  const uintptr_t base = reinterpret_cast<uintptr_t>(buffer);
  const uintptr_t end = base + validBufferSizeBytes;
  uintptr_t at = (base + ACTIVITY_RECORD_ALIGNMENT - 1) & ~uintptr_t{ACTIVITY_RECORD_ALIGNMENT - 1};
  if (*record != nullptr) {
    const uintptr_t prev = reinterpret_cast<uintptr_t>(*record);
    if (prev < at || prev >= end) return ret(CUPTI_ERROR_INVALID_PARAMETER);
    const size_t prev_size = record_size((*record)->kind);
    if (prev_size == 0) return ret(CUPTI_ERROR_INVALID_KIND);
    at = prev + prev_size;
  }
  // The end of the records is how every iteration finishes, not a failure:
  // it is not recorded for cuptiGetLastError.
  if (at >= end || end - at < sizeof(CUpti_ActivityKind)) return CUPTI_ERROR_MAX_LIMIT_REACHED;
  CUpti_ActivityKind kind;
  std::memcpy(&kind, reinterpret_cast<const void*>(at), sizeof kind);
  const size_t size = record_size(kind);
  if (size == 0 || end - at < size) return ret(CUPTI_ERROR_INVALID_KIND);
  *record = reinterpret_cast<CUpti_Activity*>(at);
  return CUPTI_SUCCESS;
}
