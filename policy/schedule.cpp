#include "schedule.h"

#include <algorithm>

namespace spillway::policy {

void ScheduleChooser::on_alloc(uint64_t id) {
  const Key k{false, ordinal_++};
  if (auto it = live_.find(id); it != live_.end()) by_key_.erase(it->second.key);
  live_[id] = {k, last_launch_};
  by_key_[k] = id;
}

void ScheduleChooser::on_free(uint64_t id) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  by_key_.erase(it->second.key);
  live_.erase(it);
}

void ScheduleChooser::on_access(const Access& a) {
  last_launch_ = std::max(last_launch_, a.launch);
  auto it = live_.find(a.block);
  if (it == live_.end()) {
    // Not seen allocated (made before this chooser): known by its id.
    const Key k{true, a.block};
    it = live_.emplace(a.block, Live{k, last_launch_}).first;
    by_key_[k] = a.block;
  }
  it->second.last_launch = a.launch;
  const uint32_t at = static_cast<uint32_t>(a.launch - std::min(a.launch, step_start_));
  std::vector<uint32_t>& uses = cur_[it->second.key];
  if (uses.empty() || uses.back() != at) {
    uses.push_back(at);
    cur_events_.push_back({at, it->second.key});
  }
}

void ScheduleChooser::on_step() {
  // Blocks still live now live across steps: from here on each is known by
  // its id, and its uses in the step move to that key. The ordinals of the
  // others close ranks, so that the next step's allocations, which will not
  // include these (weights and their gradients are made once), line up with
  // this step's.
  std::vector<uint64_t> renumber(ordinal_);
  for (uint64_t i = 0; i < ordinal_; ++i) renumber[i] = i;
  std::vector<bool> carried(ordinal_, false);
  for (auto& [id, l] : live_) {
    if (l.key.carried) continue;
    const Key now_carried{true, id};
    if (auto u = cur_.find(l.key); u != cur_.end()) {
      cur_[now_carried] = std::move(u->second);
      cur_.erase(l.key);  // (u is invalid after the insertion above)
    }
    carried[l.key.number] = true;
    by_key_.erase(l.key);
    by_key_[now_carried] = id;
    l.key = now_carried;
  }
  uint64_t next = 0;
  for (uint64_t i = 0; i < ordinal_; ++i)
    if (!carried[i]) renumber[i] = next++;
  auto rekey = [&](const Key& k) -> Key { return k.carried ? k : Key{false, renumber[k.number]}; };
  prev_.clear();
  for (auto& [k, uses] : cur_) {
    if (!k.carried && carried[k.number]) continue;  // moved above
    prev_[rekey(k)] = std::move(uses);
  }
  cur_.clear();
  prev_events_.clear();
  for (const Event& e : cur_events_)
    if (!e.key.carried && !carried[e.key.number]) prev_events_.push_back({e.launch, rekey(e.key)});
  // The carried blocks' events (their keys may have changed above).
  for (const auto& [k, uses] : prev_)
    if (k.carried)
      for (uint32_t at : uses) prev_events_.push_back({at, k});
  std::stable_sort(prev_events_.begin(), prev_events_.end(),
                   [](const Event& a, const Event& b) { return a.launch < b.launch; });
  cur_events_.clear();
  prev_len_ = now();
  step_start_ = last_launch_;
  ordinal_ = 0;
  cursor_ = 0;
  have_prev_ = true;
}

const std::vector<uint32_t>* ScheduleChooser::predecessor_uses(const Key& k) const {
  auto it = prev_.find(k);
  return it == prev_.end() || it->second.empty() ? nullptr : &it->second;
}

uint64_t ScheduleChooser::next_use(uint64_t id) const {
  if (!have_prev_) return kUnknown;
  auto it = live_.find(id);
  if (it == live_.end()) return kUnknown;
  const std::vector<uint32_t>* uses = predecessor_uses(it->second.key);
  if (!uses) return kUnknown;
  const uint32_t t = now();
  if (auto u = std::upper_bound(uses->begin(), uses->end(), t); u != uses->end()) return *u - t;
  if (!it->second.key.carried) return kNever;
  return (prev_len_ > t ? prev_len_ - t : 0) + uses->front();
}

std::vector<uint64_t> ScheduleChooser::choose(std::vector<Candidate> c, size_t need) {
  if (!have_prev_) return LruChooser().choose(std::move(c), need);
  struct Ranked {
    uint64_t distance;
    const Candidate* c;
  };
  std::vector<Ranked> r;
  r.reserve(c.size());
  for (const Candidate& x : c) {
    uint64_t d = next_use(x.id);
    if (d == kUnknown) {
      // No prediction: as long as it has gone unused, a guess that ranks it
      // among the predicted ones (least recently used goes first).
      auto it = live_.find(x.id);
      d = it == live_.end() ? 0 : last_launch_ - std::min(last_launch_, it->second.last_launch);
    }
    r.push_back({d, &x});
  }
  std::sort(r.begin(), r.end(), [](const Ranked& a, const Ranked& b) {
    if (a.distance != b.distance) return a.distance > b.distance;
    return a.c->last_use != b.c->last_use ? a.c->last_use < b.c->last_use : a.c->id < b.c->id;
  });
  std::vector<uint64_t> out;
  size_t freed = 0;
  for (const Ranked& x : r) {
    if (freed >= need) break;
    out.push_back(x.c->id);
    freed += x.c->bytes;
  }
  return out;
}

std::vector<uint64_t> ScheduleChooser::upcoming(size_t launches) {
  std::vector<uint64_t> out;
  if (!have_prev_) return out;
  const uint32_t t = now();
  while (cursor_ < prev_events_.size() && prev_events_[cursor_].launch <= t) ++cursor_;
  for (size_t i = cursor_; i < prev_events_.size() && prev_events_[i].launch <= t + launches; ++i) {
    auto it = by_key_.find(prev_events_[i].key);
    if (it == by_key_.end()) continue;
    if (std::find(out.begin(), out.end(), it->second) == out.end()) out.push_back(it->second);
  }
  return out;
}

}  // namespace spillway::policy
