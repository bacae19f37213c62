// The access interface: what the tracker (cupti_trace/) reports to the
// allocator (shim/), and what both sides read. The one header the two share,
// so that neither depends on the other's internals.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

namespace spillway {

// [lo, hi): a range a launch, copy or set may touch. A pointer found in a
// kernel's arguments is {p, p + 1}: the kernel may use the whole block.
struct Touch {
  uintptr_t lo, hi;
};

// Set while spillway itself calls the driver (evicting, restoring, mapping):
// those calls are not the job's accesses, and the tracker ignores them.
class InternalCalls {
 public:
  InternalCalls() : outer_(active_) { active_ = true; }
  ~InternalCalls() { active_ = outer_; }
  InternalCalls(const InternalCalls&) = delete;
  InternalCalls& operator=(const InternalCalls&) = delete;
  static bool active() { return active_; }

 private:
  bool outer_;
  static inline thread_local bool active_ = false;
};

// The CUPTI correlation id of the job's driver call whose callback this
// thread is handling (0 outside one), set by the tracker: the copies spillway
// makes for that call belong to it in the trace.
class CurrentCall {
 public:
  static uint32_t correlation() { return correlation_; }
  static void set_correlation(uint32_t id) { correlation_ = id; }

 private:
  static inline thread_local uint32_t correlation_ = 0;
};

// The work about to use some ranges: what the policy, the trace and the
// record need to know of it.
struct Access {
  enum class Kind : uint8_t { kLaunch, kCopy, kSet, kGraphLaunch, kCollective };
  Kind kind = Kind::kLaunch;
  CUstream stream = nullptr;
  const char* name = nullptr;  // kernel name (lives as long as the process), or null
  uint64_t seq = 0;            // one per launch, copy or set
  uint32_t correlation = 0;    // CUPTI's correlation id of the call (activity records carry it)
};

class AccessSink {
 public:
  virtual ~AccessSink() = default;
  // Could `p` be inside one of the sink's blocks? Called for every argument
  // word of every launch: must be a lock-free range check.
  virtual bool may_own(uintptr_t p) const = 0;
  // [lo, hi) holding every address the sink may own (an envelope; may be
  // wider): the scan's inline first check, so most words cost no call.
  virtual void envelope(uintptr_t* lo, uintptr_t* hi) const = 0;
  // Work on `a.stream` is about to use these ranges: make their blocks
  // resident (restore, or cancel an eviction in flight), record the stream
  // as a user, and hold them (as hold() does) until the caller releases
  // them once the work is queued: no eviction may start on a block between
  // this call and the queueing (its copy would be ordered before the work).
  // A launch's ranges come in one call: its blocks are one unit. Returns
  // whether it held anything (false: nothing to release).
  virtual bool before_use(const Access& a, const Touch* touches, size_t n) = 0;
  // The work before_use was told of is queued on `stream`: release its
  // holds, and let a copy of these blocks wait for exactly that work from
  // now on (copy_streams.h: marks) rather than for the stream's tail.
  virtual void after_use(CUstream stream, const Touch* touches, size_t n) = 0;
  // The blocks under these ranges must stay resident until released: work
  // captured into a CUDA graph (it runs whenever the graph is launched), a
  // collective in flight, a user's pin. Holds nest; a held block that is
  // on the host is restored. Freeing a block drops its holds.
  virtual void hold(const Touch* touches, size_t n) = 0;
  virtual void release(const Touch* touches, size_t n) = 0;
};

}  // namespace spillway
