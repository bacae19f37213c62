// Activity records: the CUDA 13 structs this library writes, their sizes,
// and the conversion from the driver's simbridge::Activity.
#pragma once

#include <algorithm>
#include <cstddef>

#include <cupti.h>

#include "cupti_bridge.h"

namespace simcupti {

// Size of a record of `kind` as written into a buffer; 0 for the kinds this
// library never writes.
size_t record_size(CUpti_ActivityKind kind);

inline constexpr size_t kMaxRecordSize = std::max(
    {sizeof(CUpti_ActivityKernel10), sizeof(CUpti_ActivityMemcpy6), sizeof(CUpti_ActivityMemset4)});

// cupti_common.h: records are ACTIVITY_RECORD_ALIGNMENT-aligned, so a
// buffer's records follow each other with no padding.
static_assert(sizeof(CUpti_ActivityKernel10) % ACTIVITY_RECORD_ALIGNMENT == 0);
static_assert(sizeof(CUpti_ActivityMemcpy6) % ACTIVITY_RECORD_ALIGNMENT == 0);
static_assert(sizeof(CUpti_ActivityMemset4) % ACTIVITY_RECORD_ALIGNMENT == 0);

// Writes `a` as a record of `kind` (a kind with a nonzero record_size that
// matches a.kind) into `out`, which holds record_size(kind) bytes.
void encode(const simbridge::Activity& a, CUpti_ActivityKind kind, void* out);

}  // namespace simcupti
