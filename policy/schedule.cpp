#include "schedule.h"

#include <algorithm>
#include <utility>

namespace spillway::policy {

void ScheduleChooser::on_alloc(uint64_t id) {
  live_[id] = {Key{}, false, last_launch_, nullptr, 0, now(), true};
}

void ScheduleChooser::on_free(uint64_t id) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  // Its record keeps where its memory was given back (the planner's model);
  // one known by its id has no successor, and a block made later at the
  // same address is keyed by its first use until a step ends with it live,
  // which replaces this record.
  Tracked& l = it->second;
  if (l.keyed && recording_ && l.bytes) record_of(l).free = now();
  if (l.keyed && !l.key.carried)
    if (auto n = named_.find(l.prev_key); n != named_.end() && n->second == id) named_.erase(n);
  live_.erase(it);
}

void ScheduleChooser::on_access(const Use& a) {
  // One order, even if reports from several threads interleave.
  const uint64_t launch = std::max(a.launch, last_launch_);
  // Position among the blocks this launch touches, in the order reported.
  if (launch != cur_launch_) {
    cur_launch_ = launch;
    pos_ = 0;
  } else {
    ++pos_;
  }
  last_launch_ = launch;
  const uint32_t at = since_start(launch);
  auto it = live_.find(a.block);
  if (it == live_.end())  // not seen allocated (made before this chooser)
    it = live_.emplace(a.block, Tracked{Key{true, a.block}, true, launch, nullptr, 0, 0, false})
             .first;
  Tracked& l = it->second;
  const uint64_t place = std::min<uint32_t>(pos_, 0xffff);
  if (!l.keyed) {
    // Its first use: the launch's index in the step and the block's place in
    // it name the block in the next step; in the previous one, the same
    // place in its aligned launch.
    l.key = Key{false, (uint64_t{at} << 16) | place};
    l.prev_key = Key{false, (now_prev() << 16) | place};
    l.keyed = true;
    named_[l.prev_key] = a.block;
  }
  if (launch != l.last_launch || l.nth == 0) {
    if (l.nth > 0 && first_reuse_ == 0) first_reuse_ = at;
    // The nth use of a block live across both steps aligns them.
    if (l.key.carried)
      if (const std::vector<uint32_t>* u = predecessor_uses(l.key); u && l.nth < u->size())
        offset_ = int64_t{(*u)[l.nth]} - int64_t{at};
    ++l.nth;
  }
  l.last_launch = launch;
  l.bytes = std::max<uint64_t>(l.bytes, a.bytes);
  record(l, at);
}

ScheduleChooser::Record& ScheduleChooser::record_of(Tracked& l) {
  if (!l.uses) {
    auto [it, added] = cur_.try_emplace(l.key);
    l.uses = &it->second;  // stable: node-based map, until cur_ is replaced
    if (added) {
      recorded_ += kKeyUnits;
      it->second.made = l.made;
      it->second.alloc = l.made ? l.alloc_at : 0;
    }
  }
  l.uses->bytes = std::max(l.uses->bytes, l.bytes);
  return *l.uses;
}

void ScheduleChooser::record(Tracked& l, uint32_t at) {
  if (!recording_) return;
  std::vector<uint32_t>& uses = record_of(l).uses;
  if (!uses.empty() && uses.back() >= at) return;
  uses.push_back(at);
  if (++recorded_ > max_units_) {
    Uses().swap(cur_);   // the memory too, not only the entries
    recording_ = false;  // every Tracked's `uses` dangles: none is read until on_step
  }
}

void ScheduleChooser::on_step(uint64_t end) {
  // Blocks still live now live across steps: from here on each is known by
  // its id. Their uses in the step are copied to that key; the first-use
  // entry stays, for the next step's block made at the same point.
  for (auto& [id, l] : live_) {
    // A block live through the whole step without a use still held memory.
    if (recording_ && l.keyed && l.key.carried && !l.uses && l.bytes) record_of(l);
    Record* rec = std::exchange(l.uses, nullptr);  // cur_ is replaced below
    l.made = false;
    l.nth = 0;
    if (l.keyed && l.key.carried) continue;
    const Key carried{true, id};
    if (rec && recording_)
      cur_.insert_or_assign(carried, *rec);
    else if (recording_)
      cur_.erase(carried);  // a block freed at this address: not this one's predecessor
    l.key = carried;
    l.keyed = true;
  }
  const uint64_t e = std::max(end, last_launch_);
  dropped_.clear();
  prev_len_ = recording_ ? drop_making_launches(since_start(e)) : since_start(e);
  prev_ = std::move(cur_);
  Uses().swap(cur_);
  have_prev_ = recording_;
  named_.clear();  // every block live now is known by its id
  scanned_ = 0;
  offset_ = 0;
  recording_ = true;
  recorded_ = 0;
  fresh_ = live_.empty();
  first_reuse_ = 0;
  step_start_ = e;
  last_launch_ = e;
  by_launch_.assign(have_prev_ ? prev_len_ + 1 : 0, {});
  if (have_prev_)
    for (const auto& entry : prev_)  // prev_ stays as it is until the next step
      for (uint32_t u : entry.second.uses)
        if (u < by_launch_.size()) by_launch_[u].push_back(&entry);
}

uint32_t ScheduleChooser::drop_making_launches(uint32_t n) {
  // A launch that made a block still live at the step's end (its first use)
  // and touched nothing else but blocks live from before the step, a weight
  // at least, is taken as one-off: a first step filling the optimizer's
  // state with zeros. The next step has the block from its start. Left in,
  // its uses of the weights would align the next step's nth use of a weight
  // with the wrong launch, and its blocks' allocations would be expected
  // again. Work that repeats touches what the step makes: a gradient made in
  // backward reads activations, a loss reads the output, and an input's copy
  // touches no weight. A lasting block may hold several allocations (the
  // rest of a cached block split off for the next, Allocator::malloc_part):
  // a later use of one made by a launch left out counts as making too, so
  // the second state tensor's fill goes with the first's, while an update
  // that also reads a gradient (made by backward, which stays) is kept.
  //
  // A step with nothing live at its start (a job's first: its first mark
  // comes after its first step()) made its weights too. Those are the blocks
  // still live at its end that were allocated before its first launch F to
  // use a block an earlier launch used (the set-up allocates the weights and
  // fills them by copies or by kernels of their own), and before the launch
  // ahead of F, whose own outputs are allocated just before it: they count
  // as live from before the step. The output and the loss come later.
  if (fresh_ && first_reuse_ > 0)
    for (auto& [k, r] : cur_)
      if (k.carried && r.made && r.free == StepModel::kLive && r.alloc + 1 < first_reuse_) {
        r.made = false;
        r.alloc = 0;
      }
  std::vector<uint8_t> lasting(n + 1, 0), other(n + 1, 0), weight(n + 1, 0);
  std::vector<std::pair<uint32_t, uint32_t>> later;  // (a later use, that block's first)
  for (const auto& [k, r] : cur_) {
    if (!k.carried && r.free == StepModel::kLive) continue;  // also under its id
    const bool lasts = r.made && r.free == StepModel::kLive && !r.uses.empty();
    for (size_t i = 0; i < r.uses.size(); ++i) {
      const uint32_t u = r.uses[i];
      if (u > n) continue;
      if (!r.made) {
        weight[u] = 1;
      } else if (!lasts) {
        other[u] = 1;
      } else {
        lasting[u] = 1;
        if (i > 0) later.emplace_back(u, r.uses[0]);
      }
    }
  }
  std::sort(later.begin(), later.end());
  // shift[u]: launches dropped up to launch number u.
  std::vector<uint32_t> shift(n + 1, 0);
  size_t next = 0;
  for (uint32_t u = 1; u <= n; ++u) {
    bool drop = lasting[u] && weight[u] && !other[u];
    for (; next < later.size() && later[next].first == u; ++next) {
      const uint32_t f = later[next].second;  // < u: decided already
      drop = drop && shift[f] != shift[f - 1];
    }
    shift[u] = shift[u - 1] + drop;
    if (drop) dropped_.push_back(u - 1);
  }
  if (dropped_.empty()) return n;
  auto dropped = [&](uint32_t u) { return u >= 1 && u <= n && shift[u] != shift[u - 1]; };
  auto renumber = [&](uint32_t u) { return u == StepModel::kLive ? u : u - shift[std::min(u, n)]; };
  Uses out;
  for (auto& [k, r] : cur_) {
    Key key = k;
    if (!k.carried) {
      const auto at = static_cast<uint32_t>(k.number >> 16);
      if (dropped(at)) continue;  // its block was one of those made
      key.number = (uint64_t{renumber(at)} << 16) | (k.number & 0xffff);
    }
    Record rec;
    rec.bytes = r.bytes;
    rec.made = r.made;
    rec.alloc = renumber(r.alloc);
    rec.free = renumber(r.free);
    if (k.carried && r.made && !r.uses.empty() && dropped(r.uses.front())) {
      rec.made = false;  // made by a launch that does not repeat: live from before
      rec.alloc = 0;
    }
    for (uint32_t u : r.uses)
      if (!dropped(u)) rec.uses.push_back(renumber(u));
    out.emplace(key, std::move(rec));
  }
  cur_ = std::move(out);
  return n - shift[n];
}

std::vector<uint64_t> ScheduleChooser::choose_beyond(std::vector<Candidate> c, size_t need,
                                                     uint64_t beyond) {
  if (!have_prev_) return {};
  return furthest_first(std::move(c), need, beyond);
}

void ScheduleChooser::upcoming(uint32_t ahead, std::vector<uint64_t>* ids) {
  if (by_launch_.empty()) return;
  const uint64_t t = now_prev();
  const uint64_t to = t + ahead;
  for (uint64_t q = std::max(scanned_, t) + 1; q <= to; ++q) {
    // Past this step's length: launch q - prev_len_ of the next step, where
    // only blocks known by their id are still the same blocks.
    const bool next = q > prev_len_;
    const uint64_t at = next ? q - prev_len_ : q;
    if (at >= by_launch_.size()) break;
    for (const Uses::value_type* entry : by_launch_[at]) {
      const Key& k = entry->first;
      if (k.carried) {
        // The same block only if it is still known by its id (not a block
        // made since at a freed one's address).
        if (auto l = live_.find(k.number); l != live_.end() && l->second.key.carried)
          ids->push_back(k.number);
      } else if (!next) {
        if (auto n = named_.find(k); n != named_.end()) ids->push_back(n->second);
      }
    }
  }
  scanned_ = std::max(scanned_, to);
}

const std::vector<uint32_t>* ScheduleChooser::predecessor_uses(const Key& k) const {
  auto it = prev_.find(k);
  return it == prev_.end() || it->second.uses.empty() ? nullptr : &it->second.uses;
}

uint64_t ScheduleChooser::model_id(uint64_t id) const {
  auto it = live_.find(id);
  if (it == live_.end() || !it->second.keyed) return 0;
  // A block made in this step is named, in the last step's model, by its
  // first use there: prev_key (its own key names it for the next model).
  const Tracked& l = it->second;
  return model_id(l.key.carried ? l.key : l.prev_key);
}

uint64_t ScheduleChooser::live_block(uint64_t id) const {
  // Known by its id: the same block while it still is (the allocator's ids
  // are addresses, so even: a made block's names are odd).
  if (auto l = live_.find(id); l != live_.end() && l->second.key.carried) return id;
  if (id % 2 == 0) return 0;
  auto n = named_.find(Key{false, id / 2});
  return n == named_.end() ? 0 : n->second;
}

StepModel ScheduleChooser::learned_step(uint64_t granule) const {
  StepModel m;
  if (!have_prev_) return m;
  const uint32_t n = prev_len_;
  m.launch_ns.assign(n, 0);
  for (const auto& [key, rec] : prev_) {
    // A block made in the step and live at its end is also recorded under
    // its id (on_step): that record stands for it.
    if (!key.carried && rec.free == StepModel::kLive) continue;
    if (rec.bytes == 0) continue;
    StepModel::Block b;
    b.id = model_id(key);
    b.bytes = granule ? (rec.bytes + granule - 1) / granule * granule : rec.bytes;
    b.alloc = rec.made ? std::min(rec.alloc, n) : 0;
    b.free = rec.free == StepModel::kLive ? StepModel::kLive : std::min(rec.free, n);
    if (b.free != StepModel::kLive && b.free <= b.alloc) continue;  // no launch saw it live
    b.carried = !rec.made && rec.free == StepModel::kLive;
    for (uint32_t u : rec.uses) {
      const uint32_t at = u - 1;  // from 0
      if (at >= b.alloc && at < std::min(b.free, n)) b.uses.push_back(at);
    }
    m.blocks.push_back(std::move(b));
  }
  // One order whatever the hash map's: the planner is deterministic for a
  // given model.
  std::sort(m.blocks.begin(), m.blocks.end(),
            [](const StepModel::Block& x, const StepModel::Block& y) { return x.id < y.id; });
  return m;
}

uint64_t ScheduleChooser::next_use(uint64_t id) const {
  auto it = live_.find(id);
  return it == live_.end() ? kUnknown : next_use(it->second);
}

uint64_t ScheduleChooser::next_use(const Tracked& l) const {
  if (!have_prev_ || !l.keyed) return kUnknown;
  const std::vector<uint32_t>* uses = predecessor_uses(l.key.carried ? l.key : l.prev_key);
  if (!uses) return kUnknown;
  const uint64_t t = now_prev();
  if (auto u = std::upper_bound(uses->begin(), uses->end(), t); u != uses->end()) return *u - t;
  if (!l.key.carried) return kNever;
  return (prev_len_ > t ? prev_len_ - t : 0) + uses->front();
}

std::vector<uint64_t> ScheduleChooser::first_step_order(std::vector<Candidate> c,
                                                        size_t need) const {
  std::vector<std::pair<uint64_t, Candidate>> ranked;  // (rank, candidate)
  ranked.reserve(c.size());
  for (const Candidate& x : c) {
    auto it = live_.find(x.id);
    // One this chooser never saw used counts as idle since ever.
    const uint64_t idle = it == live_.end() ? UINT64_MAX : idle_launches(it->second);
    // Idle past the guard: ranks above every other (kFirstStepGuard + 1 and
    // up), the least idle highest; within it: the most idle highest.
    const uint64_t rank = idle > kFirstStepGuard ? UINT64_MAX - (idle - kFirstStepGuard - 1) : idle;
    ranked.push_back({rank, x});
  }
  return highest_first(std::move(ranked), need);
}

std::vector<uint64_t> ScheduleChooser::choose(std::vector<Candidate> c, size_t need) {
  if (!have_prev_) return first_step_order(std::move(c), need);
  return furthest_first(std::move(c), need, kUnknown);
}

std::vector<uint64_t> ScheduleChooser::furthest_first(std::vector<Candidate> c, size_t need,
                                                      uint64_t beyond) const {
  std::vector<std::pair<uint64_t, Candidate>> ranked;  // (distance, candidate)
  ranked.reserve(c.size());
  for (const Candidate& x : c) {
    auto it = live_.find(x.id);
    uint64_t d = it == live_.end() ? kUnknown : next_use(it->second);
    if (beyond != kUnknown) {
      if (d == kUnknown || d <= beyond) continue;  // only predicted uses after `beyond`
    } else if (d == kUnknown) {
      // No prediction: as long as it has gone unused, a guess that ranks it
      // among the predicted ones (least recently used goes first).
      d = it == live_.end() ? 0 : idle_launches(it->second);
    }
    ranked.push_back({d, x});
  }
  return highest_first(std::move(ranked), need);
}

std::vector<uint64_t> ScheduleChooser::highest_first(
    std::vector<std::pair<uint64_t, Candidate>> ranked, size_t need) {
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : used_earlier(a.second, b.second);
  });
  std::vector<Candidate> c;
  c.reserve(ranked.size());
  for (const auto& r : ranked) c.push_back(r.second);
  return first_covering(c, need);
}

}  // namespace spillway::policy
