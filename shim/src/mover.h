// The background mover: evicts ahead of need from its own thread when
// resident memory nears the budget, so that allocations rarely wait for an
// eviction copy themselves, and finishes the copies in flight (evictions and
// prefetches, whoever started them) so that the job's thread rarely remaps.
// It also runs work the allocator hands it that needs no lock and should not
// hold up the job's thread (a step plan, SPILLWAY_PLAN) at each round's start.
// Under the allocator's lock a batch is chosen and its copies queued
// (`begin`); the oldest copy in flight is waited for without it, one at a
// time, and what is done is swapped under the lock again (`end`).
#pragma once

#include <cuda.h>

#include <functional>
#include <vector>

#include "block.h"
#include "driver.h"
#include "raii.h"
#include "worker.h"

namespace spillway {

class Mover {
 public:
  // begin(spare): under the allocator's lock, finish what is done, start a
  // batch of evictions if memory is near the budget, and return the event
  // that marks the end of the oldest copy in flight (`spare`, recorded by
  // begin, where it has none), or null: nothing in flight, the round ends.
  // end(): under the lock, finish what is done now (the job's thread may
  // have finished some of it already); true if copies are still in flight,
  // and the next round follows at once.
  using Begin = std::function<CUevent(CUevent spare)>;
  using End = std::function<bool()>;

  Mover(const cu::Driver& d, Begin begin, End end, std::function<void()> before_swap,
        std::function<void()> work = nullptr)
      : d_(d),
        spare_(d),
        begin_(std::move(begin)),
        end_(std::move(end)),
        before_swap_(std::move(before_swap)),
        work_(std::move(work)) {}
  ~Mover() { stop(); }

  void start();
  // Resident memory crossed the high watermark: run a round now.
  void wake() { worker_.wake(); }
  // Waits for the round in progress. Idempotent.
  void stop() { worker_.stop(); }

 private:
  void round();

  const cu::Driver& d_;
  Event spare_;
  Begin begin_;
  End end_;
  std::function<void()> before_swap_;  // test seam: after the copies, before the swap
  std::function<void()> work_;         // without the lock, before each round
  Worker worker_;
};

}  // namespace spillway
