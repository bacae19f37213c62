#include "plan_follower.h"

#include <algorithm>
#include <unordered_map>

namespace spillway::policy {

void PlanFollower::start(const StepModel& m, const Plan& p, uint32_t from) {
  const auto len = static_cast<uint32_t>(m.launch_ns.size());
  evict_.clear();
  prefetch_.clear();
  std::unordered_map<uint64_t, const Move*> wraps;  // carried block -> its wrapped move
  for (const Move& mv : p.moves) {
    evict_.push_back({mv.evict_after, {mv.block, mv.next_use}});
    if (mv.prefetch_at == Move::kNever) continue;
    if (mv.prefetch_at < len)
      prefetch_.push_back({mv.prefetch_at, {mv.block, mv.next_use}});
    else
      wraps[mv.block] = &mv;
  }
  for (const StepModel::Block& b : m.blocks) {
    if (!b.carried || b.uses.empty()) continue;
    auto w = wraps.find(b.id);
    if (w == wraps.end()) {
      prefetch_.push_back({0, {b.id, b.uses.front()}});
    } else {
      // Off the device from the start until its prefetch, as the plan has it.
      evict_.push_back({0, {b.id, w->second->next_use - len}});
      prefetch_.push_back({w->second->prefetch_at - len, {b.id, w->second->next_use - len}});
    }
  }
  allocated_by_.assign(len + 1, 0);
  for (const StepModel::Block& b : m.blocks)
    if (!b.carried && b.alloc <= len) allocated_by_[b.alloc] += b.bytes;
  for (uint32_t i = 1; i <= len; ++i) allocated_by_[i] += allocated_by_[i - 1];
  auto by_at = [](const Entry& a, const Entry& b) { return a.at < b.at; };
  std::stable_sort(evict_.begin(), evict_.end(), by_at);
  std::stable_sort(prefetch_.begin(), prefetch_.end(), by_at);
  auto first_from = [from](const std::vector<Entry>& v) {
    return static_cast<size_t>(
        std::lower_bound(v.begin(), v.end(), from,
                         [](const Entry& e, uint32_t at) { return e.at < at; }) -
        v.begin());
  };
  next_evict_ = first_from(evict_);
  next_prefetch_ = first_from(prefetch_);
  // A plan with no move still brings carried blocks back (a step that fits).
  active_ = !evict_.empty() || !prefetch_.empty();
}

bool PlanFollower::allocations_match(uint32_t at, uint64_t allocated, uint64_t slack) const {
  if (!active_ || allocated_by_.empty()) return true;
  // Checked after each allocation, so a step midway through the blocks it
  // allocates between two launches lies between the model's totals by the
  // launch before (`at` counts the next one, and is 1 before the first too)
  // and by the next.
  const size_t last = allocated_by_.size() - 1;
  const uint64_t upper = allocated_by_[std::min<size_t>(at, last)];
  const uint64_t lower = at >= 2 ? allocated_by_[std::min<size_t>(at - 2, last)] : 0;
  if (allocated > upper) return allocated - upper <= std::max(slack, allocated / 8);
  if (allocated < lower) return lower - allocated <= std::max(slack, lower / 8);
  return true;
}

void PlanFollower::stop() {
  evict_.clear();
  prefetch_.clear();
  allocated_by_.clear();
  next_evict_ = next_prefetch_ = 0;
  active_ = false;
}

void PlanFollower::evictions_due(uint32_t at, std::vector<Due>* out) {
  for (; next_evict_ < evict_.size() && evict_[next_evict_].at <= at; ++next_evict_)
    out->push_back(evict_[next_evict_].due);
}

void PlanFollower::prefetches_due(uint32_t at, std::vector<Due>* out) {
  for (; next_prefetch_ < prefetch_.size() && prefetch_[next_prefetch_].at <= at; ++next_prefetch_)
    out->push_back(prefetch_[next_prefetch_].due);
}

}  // namespace spillway::policy
