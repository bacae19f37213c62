// What the tracker reports to: the allocator, through this interface, so
// that cupti_trace/ does not depend on the allocator's internals.
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

class AccessSink {
 public:
  virtual ~AccessSink() = default;
  // Could `p` be inside one of the sink's blocks? Called for every argument
  // word of every launch: must be a lock-free range check.
  virtual bool may_own(uintptr_t p) const = 0;
  // Work on `stream` is about to use these ranges: make their blocks resident
  // (restore, or cancel an eviction in flight) and record the stream as a
  // user. Called before the launch, copy or set is queued.
  virtual void before_use(const Touch* touches, size_t n, CUstream stream) = 0;
};

}  // namespace spillway
