#include "activity.h"

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "buffers.h"
#include "driver.h"
#include "errors.h"
#include "faults.h"
#include "records.h"

namespace simcupti {
namespace {

static_assert(CUPTI_ACTIVITY_KIND_COUNT <= 64, "one bit per kind");
std::atomic<uint64_t> g_enabled{0};

constexpr uint64_t bit(CUpti_ActivityKind kind) {
  return uint64_t{1} << kind;
}

bool is_enabled(uint64_t mask, CUpti_ActivityKind kind) {
  return (mask & bit(kind)) != 0;
}

bool valid_kind(CUpti_ActivityKind kind) {
  return kind > CUPTI_ACTIVITY_KIND_INVALID && kind < CUPTI_ACTIVITY_KIND_COUNT;
}

// The kinds the driver reports; every other valid kind is refused.
bool modelled(CUpti_ActivityKind kind) {
  return record_size(kind) != 0;
}

}  // namespace

void disable_all_activity() {
  g_enabled.store(0, std::memory_order_relaxed);
}

// A kernel is reported once: as KERNEL when that kind is enabled (it is the
// stronger request, serializing kernels on hardware), else as
// CONCURRENT_KERNEL.
void on_activity(const simbridge::Activity& a) {
  const uint64_t mask = g_enabled.load(std::memory_order_relaxed);
  CUpti_ActivityKind kind = CUPTI_ACTIVITY_KIND_INVALID;
  switch (a.kind) {
    case simbridge::Activity::Kind::kKernel:
      if (is_enabled(mask, CUPTI_ACTIVITY_KIND_KERNEL))
        kind = CUPTI_ACTIVITY_KIND_KERNEL;
      else if (is_enabled(mask, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL))
        kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
      break;
    case simbridge::Activity::Kind::kMemcpy:
      if (is_enabled(mask, CUPTI_ACTIVITY_KIND_MEMCPY)) kind = CUPTI_ACTIVITY_KIND_MEMCPY;
      break;
    case simbridge::Activity::Kind::kMemset:
      if (is_enabled(mask, CUPTI_ACTIVITY_KIND_MEMSET)) kind = CUPTI_ACTIVITY_KIND_MEMSET;
      break;
  }
  if (kind == CUPTI_ACTIVITY_KIND_INVALID) return;
  alignas(ACTIVITY_RECORD_ALIGNMENT) std::byte record[kMaxRecordSize];
  encode(a, kind, record);
  append_record(record, record_size(kind));
}

}  // namespace simcupti

using simcupti::ret;

// cupti_activity.h: CUPTI_ERROR_INVALID_KIND "if the activity kind is not
// supported", CUPTI_ERROR_NOT_COMPATIBLE "if the activity kind cannot be
// enabled". A kind outside the enum is the former; a real kind the simulator
// does not produce records for is the latter.
CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind) {
  if (CUptiResult f = simcupti::injected("cuptiActivityEnable"); f != CUPTI_SUCCESS)
    return simcupti::ret(f);
  using namespace simcupti;
  if (driver() == nullptr) return ret(CUPTI_ERROR_NOT_INITIALIZED);
  if (!valid_kind(kind)) return ret(CUPTI_ERROR_INVALID_KIND);
  if (!modelled(kind)) return ret(CUPTI_ERROR_NOT_COMPATIBLE);
  g_enabled.fetch_or(bit(kind), std::memory_order_relaxed);
  return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityDisable(CUpti_ActivityKind kind) {
  if (CUptiResult f = simcupti::injected("cuptiActivityDisable"); f != CUPTI_SUCCESS)
    return simcupti::ret(f);
  using namespace simcupti;
  if (driver() == nullptr) return ret(CUPTI_ERROR_NOT_INITIALIZED);
  if (!valid_kind(kind)) return ret(CUPTI_ERROR_INVALID_KIND);
  g_enabled.fetch_and(~bit(kind), std::memory_order_relaxed);
  return CUPTI_SUCCESS;
}
