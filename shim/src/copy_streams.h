// spillway's own copy streams, and the one way its work is ordered after the
// job's: an event recorded on the job's stream, waited for by a copy stream
// (order_after) or by the host (drain). Used under the allocator's lock (one
// event serves every call).
#pragma once

#include <cuda.h>

#include "block.h"
#include "driver.h"
#include "raii.h"

namespace spillway {

class CopyStreams {
 public:
  explicit CopyStreams(const cu::Driver& d)
      : d_(d), d2h_(d, CU_STREAM_NON_BLOCKING), h2d_(d, CU_STREAM_NON_BLOCKING), ev_(d) {}
  explicit operator bool() const { return d2h_ && h2d_ && ev_; }

  CUstream d2h() const { return d2h_.get(); }
  CUstream h2d() const { return h2d_.get(); }

  // An event recorded on a capturing stream would become part of the graph
  // (and a wait on it would join the waiter into the capture): spillway does
  // not order its own work after a stream while it captures.
  CUresult not_capturing(CUstream s) const;
  // `waiter` waits for all work queued so far on `s`.
  CUresult order_after(CUstream waiter, CUstream s);
  // ... on every stream that uses `b`.
  CUresult order_after_users(CUstream waiter, const Block& b);
  // The host waits for all work queued so far on `s`.
  CUresult drain(CUstream s);

 private:
  const cu::Driver& d_;
  Stream d2h_, h2d_;
  Event ev_;
};

}  // namespace spillway
