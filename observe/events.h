// What the allocator did, for the trace writers (SPILLWAY_TRACE,
// SPILLWAY_RECORD) and the exit summary's attribution. The allocator calls an
// Observer with its lock held: an observer must be quick, must not block on
// I/O, and must not call back into the allocator.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

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
  // SPILLWAY_STACKS=1: where the block was allocated (set by Sites on its way
  // to the next observer; the name lives as long as the process).
  const char* site = nullptr;
};

class Observer {
 public:
  virtual ~Observer() = default;
  // A transfer completed and the block's address now maps its new home.
  virtual void on_transfer(const Transfer& t) = 0;
  // Device and host memory held changed (after a malloc, free, eviction or
  // restore that changed them).
  virtual void on_memory(int device, uint64_t resident, uint64_t host, uint64_t budget) = 0;
  // The device ran out below the budget and evicting made the allocation fit.
  virtual void on_oom_avoided(int device, size_t need, size_t freed) = 0;
};

}  // namespace spillway
