// How long each launch of a step ran on the device: what the step planner
// (policy/planner.h) needs to place a prefetch a copy's time ahead of its
// use. The allocator notes each launch's correlation id with its index in
// the step; CUPTI's activity records (the reader's thread) give the
// duration by correlation id. Indices repeat from step to step, so a
// duration measured in one step stands for the same launch in the next;
// one never measured (a launch spillway did not see, a record not yet
// delivered) is taken as the median of those that were.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace spillway {

class LaunchTimes {
 public:
  // At most this many launches a step are timed (bounded memory in a job
  // that never marks a step).
  static constexpr uint32_t kMaxLaunches = 1u << 20;
  // Correlation ids waiting for their records, by the id's low bits: a
  // record that comes this many launches late finds its slot taken and is
  // dropped (its launch keeps an earlier duration, or the median).
  static constexpr uint32_t kWaiting = 1u << 15;

  LaunchTimes() : waiting_(new std::atomic<uint64_t>[kWaiting]()) {}

  // The job's threads, at every launch once a plan may be made: launch
  // `index` of the step has this correlation id. One store, no lock.
  void note(uint32_t correlation, uint32_t index);
  // The activity reader's thread: the work of `correlation` ran [start, end].
  void on_record(uint32_t correlation, uint64_t start, uint64_t end);
  // Durations of launches [0, n): measured, or the median of those measured
  // (`fallback` when none was).
  std::vector<uint64_t> durations(uint32_t n, uint64_t fallback) const;
  uint64_t measured() const;  // launches with a duration

 private:
  // Slot id % kWaiting: (correlation id << 32 | index), 0 when empty
  // (correlation ids are never 0).
  std::unique_ptr<std::atomic<uint64_t>[]> waiting_;
  mutable std::mutex mu_;     // ns_: the reader's thread against durations()
  std::vector<uint64_t> ns_;  // by index; 0: not measured
};

}  // namespace spillway
