// The budget: how much device memory spillway may hold (SPILLWAY_GPU_BUDGET)
// and host memory it may hold for evicted blocks (SPILLWAY_HOST_BUDGET), the
// counters of what it holds, and the watermarks of the background mover.
// Arithmetic only: what to free, and how, is the allocator's make-room
// cascade (Allocator::make_room).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace spillway {

// A quantity with its high-water mark and running total, as RMM's
// statistics adaptor keeps them: `+=` raises the peak, so no caller keeps a
// peak by hand.
struct Counter {
  // `peak` is the process's; `recent_peak` the peak since reset_recent_peak
  // (torch.cuda.reset_peak_memory_stats), so that a job resetting it every
  // step does not hide the process's peak from the exit summary.
  uint64_t value = 0, peak = 0, total = 0, recent_peak = 0;
  Counter& operator+=(uint64_t n) {
    value += n;
    total += n;
    peak = std::max(peak, value);
    recent_peak = std::max(recent_peak, value);
    return *this;
  }
  void reset_recent_peak() { recent_peak = value; }
  Counter& operator-=(uint64_t n) {
    value -= n;
    return *this;
  }
  // A level measured elsewhere (memory held by a pool): the peak follows it.
  void set(uint64_t v) {
    value = v;
    peak = std::max(peak, value);
    recent_peak = std::max(recent_peak, value);
  }
};

class Budget {
 public:
  Budget(uint64_t gpu, uint64_t host, size_t granule)
      : gpu_(gpu),
        host_(host),
        granule_(granule),
        high_(below(std::max<uint64_t>(granule, gpu / 20))),
        low_(below(std::max<uint64_t>(2 * granule, gpu / 10))) {}

  uint64_t gpu() const { return gpu_; }    // 0: none (SPILLWAY_MODE=off, or no eviction)
  uint64_t host() const { return host_; }  // 0: none

  // Bytes over the budget if device memory held became `held`.
  uint64_t excess(uint64_t held) const { return gpu_ && held > gpu_ ? held - gpu_ : 0; }

  // The background mover keeps resident memory between these: it starts
  // above high() and frees down to low(), so that allocations rarely wait
  // for an eviction copy themselves. Zero when there is no budget to keep.
  // Computed once: every malloc compares with high().
  uint64_t high() const { return high_; }
  uint64_t low() const { return low_; }
  // Eviction ahead of need pays only when there is room to work in.
  bool room_for_background() const { return gpu_ > 4 * granule_; }

  // An allocation once had to evict live blocks: the job does not fit the
  // budget, so evicting ahead of need pays. Until then the background mover
  // moves nothing (a job that fits moves no byte).
  void note_over() { over_seen_ = true; }
  bool over_seen() const { return over_seen_; }

 private:
  uint64_t below(uint64_t headroom) const {
    return gpu_ ? gpu_ - std::min<uint64_t>(gpu_, headroom) : 0;
  }

  uint64_t gpu_, host_;
  size_t granule_;
  uint64_t high_, low_;
  bool over_seen_ = false;
};

}  // namespace spillway
