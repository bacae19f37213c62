// What happened, as the observers of observers.h see it: the allocations and
// frees PyTorch makes, the accesses the tracker reports, step marks, and what
// the allocator did (transfers, memory held, OOMs avoided). Every observer
// (the Chrome trace, the .spwt recorder, the call-site table) gets every event
// from one list, in one order.
//
// Some events come with the allocator's lock held (on_transfer, on_memory,
// on_oom_avoided, on_own_copy): an observer must be quick, must never wait
// (for I/O, for a thread of its own, for room in a queue), and must not call
// back into the allocator. None writes a file on the caller's thread.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "access.h"
#include "clock.h"

namespace spillway {

// Why a block moved (the trace shows it on every transfer).
enum class Cause : uint8_t {
  kBudget,    // resident memory would cross SPILLWAY_GPU_BUDGET
  kPressure,  // the device itself was full below the budget (an OOM avoided)
  kPrefetch,  // brought back ahead of a predicted use
  kOnDemand,  // brought back because work was about to use it, or a pin
};
const char* cause_name(Cause c);

struct Transfer {
  bool to_host = true;  // an eviction; false: a restore
  Cause cause = Cause::kBudget;
  int device = 0;
  uintptr_t ptr = 0;          // the block's address (it never changes)
  size_t bytes = 0;           // bytes copied
  CUstream stream = nullptr;  // the copy stream it ran on
  uint64_t queued_ns = 0;     // host clock (CLOCK_MONOTONIC) when the copy was queued
  uint64_t done_ns = 0;       // host clock when spillway saw it complete
  // SPILLWAY_STACKS=1: where the block was allocated (set by Sites, first in
  // the list, for the observers after it; the name lives as long as the process).
  const char* site = nullptr;
  // The block's extent from `ptr`: every allocation PyTorch holds in
  // [ptr, ptr + span) moved (a split block's parts move together).
  size_t span = 0;
};

// An allocation PyTorch got (on_alloc), or one it gives back (on_free).
struct Allocation {
  const void* ptr = nullptr;
  size_t size = 0;
  CUstream stream = nullptr;
  int device = 0;
  const char* site = nullptr;  // as Transfer::site
};

// A copy spillway itself queued (an eviction's or a restore's), seen at the
// driver call, before it runs: the trace joins it to its activity record.
struct OwnCopy {
  uintptr_t src = 0;  // the block copied from
  size_t bytes = 0;
  CUstream stream = nullptr;
  uint32_t correlation = 0;  // CUPTI's, of this copy
};

// Every method does nothing unless overridden.
class Observer {
 public:
  virtual ~Observer() = default;

  // Called on each observer just before the event of the same argument: an
  // observer that knows more about the block (Sites: where it was allocated)
  // fills it in for the observers after it.
  virtual void annotate(Allocation&) {}
  virtual void annotate(Transfer&) {}

  // An allocation was served (after the allocator returned it).
  virtual void on_alloc(const Allocation&) {}
  // An allocation is given back (before the allocator takes it; a bad free
  // too: the allocator refuses it afterwards).
  virtual void on_free(const Allocation&) {}
  // Work is about to use these ranges (after the allocators made them
  // resident). A launch naming more than 256 candidate pointers comes in
  // several calls with the same `a.seq`.
  virtual void on_access(const Access&, const Touch*, size_t) {}
  // spillway_mark_step: step `step` begins.
  virtual void on_step(uint64_t) {}
  // A transfer completed and the block's address now maps its new home.
  virtual void on_transfer(const Transfer&) {}
  // Device and host memory held changed (after a malloc, free, eviction or
  // restore that changed them).
  virtual void on_memory(int /*device*/, uint64_t /*resident*/, uint64_t /*host*/,
                         uint64_t /*budget*/) {}
  // The device ran out below the budget and evicting made the allocation fit.
  virtual void on_oom_avoided(int /*device*/, size_t /*need*/, size_t /*freed*/) {}
  virtual void on_own_copy(const OwnCopy&) {}
};

}  // namespace spillway
