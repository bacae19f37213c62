#include "schedule.h"

#include <algorithm>

namespace spillway::policy {

void ScheduleChooser::on_alloc(uint64_t id) {
  live_[id] = {Key{}, false, last_launch_};
}

void ScheduleChooser::on_free(uint64_t id) {
  live_.erase(id);
}

void ScheduleChooser::on_access(const Access& a) {
  // Position among the blocks this launch touches, in the order reported.
  if (a.launch != cur_launch_) {
    cur_launch_ = a.launch;
    pos_ = 0;
  } else {
    ++pos_;
  }
  last_launch_ = std::max(last_launch_, a.launch);
  const uint32_t at = static_cast<uint32_t>(a.launch - std::min(a.launch, step_start_));
  auto it = live_.find(a.block);
  if (it == live_.end())  // not seen allocated (made before this chooser)
    it = live_.emplace(a.block, Live{Key{true, a.block}, true, a.launch}).first;
  Live& l = it->second;
  if (!l.keyed) {
    // Its first use: the launch's index in the step and the block's place in
    // it name the block in the next step.
    l.key = Key{false, (uint64_t{at} << 16) | std::min<uint32_t>(pos_, 0xffff)};
    l.keyed = true;
  }
  l.last_launch = a.launch;
  if (!recording_) return;
  std::vector<uint32_t>& uses = cur_[l.key];
  if (!uses.empty() && uses.back() == at) return;
  uses.push_back(at);
  if (++recorded_ > kMaxUses) {
    // A step this long (or a job that never marks steps) is not learned:
    // memory stays bounded, and victims go by least recent use.
    cur_.clear();
    recording_ = false;
  }
}

void ScheduleChooser::on_step() {
  // Blocks still live now live across steps: from here on each is known by
  // its id, and its uses in the step move to that key.
  for (auto& [id, l] : live_) {
    if (l.keyed && l.key.carried) continue;
    const Key carried{true, id};
    if (auto node = l.keyed ? cur_.extract(l.key) : decltype(cur_)::node_type{}) {
      node.key() = carried;
      cur_.insert(std::move(node));
    }
    l.key = carried;
    l.keyed = true;
  }
  prev_ = std::move(cur_);
  cur_.clear();
  have_prev_ = recording_;
  recording_ = true;
  recorded_ = 0;
  prev_len_ = now();
  step_start_ = last_launch_;
}

const std::vector<uint32_t>* ScheduleChooser::predecessor_uses(const Key& k) const {
  auto it = prev_.find(k);
  return it == prev_.end() || it->second.empty() ? nullptr : &it->second;
}

uint64_t ScheduleChooser::next_use(uint64_t id) const {
  if (!have_prev_) return kUnknown;
  auto it = live_.find(id);
  if (it == live_.end() || !it->second.keyed) return kUnknown;
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

}  // namespace spillway::policy
