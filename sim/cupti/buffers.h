// Activity buffers: the client's request/complete callbacks, the buffer being
// filled, and the count of records dropped for want of a buffer.
#pragma once

#include <cstddef>

namespace simcupti {

// Appends one encoded record of `size` bytes (a multiple of
// ACTIVITY_RECORD_ALIGNMENT, at most kMaxRecordSize), requesting a buffer if
// none is being filled, and completing the buffer once the largest record no
// longer fits. Counted as dropped when there is no usable buffer. Any thread.
void append_record(const void* record, size_t size);

// cuptiFinalize: hand every buffer back through the complete callback (the
// unused ones empty) and forget the callbacks and the dropped count.
void release_buffers();

}  // namespace simcupti
