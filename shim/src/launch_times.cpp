#include "launch_times.h"

#include <algorithm>

namespace spillway {

void LaunchTimes::note(uint32_t correlation, uint32_t index) {
  if (correlation == 0 || index >= kMaxLaunches) return;
  waiting_[correlation % kWaiting].store(uint64_t{correlation} << 32 | index,
                                         std::memory_order_relaxed);
}

void LaunchTimes::on_record(uint32_t correlation, uint64_t start, uint64_t end) {
  if (correlation == 0) return;
  std::atomic<uint64_t>& slot = waiting_[correlation % kWaiting];
  uint64_t v = slot.load(std::memory_order_relaxed);
  // Taken once: a second record of the same id (a copy the driver split)
  // finds the slot empty.
  if (v >> 32 != correlation || !slot.compare_exchange_strong(v, 0, std::memory_order_relaxed))
    return;
  const auto index = static_cast<uint32_t>(v);
  std::lock_guard lk(mu_);
  if (ns_.size() <= index) ns_.resize(index + 1, 0);
  ns_[index] = end > start ? end - start : 1;
}

std::vector<uint64_t> LaunchTimes::durations(uint32_t n, uint64_t fallback) const {
  std::lock_guard lk(mu_);
  std::vector<uint64_t> known;
  for (uint32_t i = 0; i < n && i < ns_.size(); ++i)
    if (ns_[i]) known.push_back(ns_[i]);
  uint64_t median = fallback;
  if (!known.empty()) {
    std::nth_element(known.begin(), known.begin() + known.size() / 2, known.end());
    median = known[known.size() / 2];
  }
  std::vector<uint64_t> out(n, median);
  for (uint32_t i = 0; i < n && i < ns_.size(); ++i)
    if (ns_[i]) out[i] = ns_[i];
  return out;
}

uint64_t LaunchTimes::measured() const {
  std::lock_guard lk(mu_);
  return static_cast<uint64_t>(std::count_if(ns_.begin(), ns_.end(), [](uint64_t v) { return v; }));
}

}  // namespace spillway
