// How long each launch of a step ran on the device: what the step planner
// (policy/planner.h) needs to place a prefetch a copy's time ahead of its
// use. The allocator notes each launch's correlation id with its index in
// the step; CUPTI's activity records (the reader's thread) give the
// duration by correlation id. Indices repeat from step to step, so a
// duration measured in one step stands for the same launch in the next;
// one never measured (a launch spillway did not see, a record not yet
// delivered) is taken as the median of those that were.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace spillway {

class LaunchTimes {
 public:
  // At most this many launches a step are timed, and this many correlation
  // ids wait for their records: bounded memory in a job that never marks a
  // step.
  static constexpr uint32_t kMaxLaunches = 1u << 20;

  // The job's threads: launch `index` of the step has this correlation id.
  void note(uint32_t correlation, uint32_t index);
  // The activity reader's thread: the work of `correlation` ran [start, end].
  void on_record(uint32_t correlation, uint64_t start, uint64_t end);
  // Durations of launches [0, n): measured, or the median of those measured
  // (`fallback` when none was).
  std::vector<uint64_t> durations(uint32_t n, uint64_t fallback) const;
  uint64_t measured() const;  // launches with a duration

 private:
  mutable std::mutex mu_;
  std::unordered_map<uint32_t, uint32_t> waiting_;  // correlation id -> index
  std::vector<uint64_t> ns_;                        // by index; 0: not measured
};

}  // namespace spillway
