// The background mover: evicts ahead of need from its own thread when
// resident memory nears the budget, so that allocations rarely wait for an
// eviction copy themselves. A batch is chosen and its copies queued under the
// allocator's lock (`begin`), the copies run and are waited for without it,
// and the swap to host memory happens under the lock again (`end`).
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
  // begin(done): under the allocator's lock, start a batch of evictions and
  // record `done` on the copy stream after it; false: nothing to wait for,
  // the round ends. end(): under the lock, finish the evictions whose copies
  // are done (the job's thread may have finished some of them already).
  using Begin = std::function<bool(CUevent done)>;
  using End = std::function<void()>;

  Mover(const cu::Driver& d, Begin begin, End end, std::function<void()> before_swap)
      : d_(d),
        done_(d),
        begin_(std::move(begin)),
        end_(std::move(end)),
        before_swap_(std::move(before_swap)) {}
  ~Mover() { stop(); }

  void start();
  // Resident memory crossed the high watermark: run a round now.
  void wake() { worker_.wake(); }
  // Waits for the round in progress. Idempotent.
  void stop() { worker_.stop(); }

 private:
  void round();

  const cu::Driver& d_;
  Event done_;
  Begin begin_;
  End end_;
  std::function<void()> before_swap_;  // test seam: after the copies, before the swap
  Worker worker_;
};

}  // namespace spillway
