// Loading a trace for replay: every record checked by trace::Reader, the
// DURATION records folded into their launches, and the facts the anchor
// strategies need ahead of time (which tensors are saved for backward, where
// each layer's forward ends).
#include <algorithm>
#include <cstdlib>
#include <unordered_map>

#include "replay.h"

namespace replay {

using namespace spillway::trace;

namespace {

// A number-valued top-level key of the meta JSON, or 0 (a light look-up: the
// replayer needs only small integers from meta). Saturates at INT64_MAX.
int64_t meta_int(const std::string& meta, const std::string& key) {
  const std::string k = "\"" + key + "\"";
  size_t p = meta.find(k);
  if (p == std::string::npos) return 0;
  p = meta.find(':', p + k.size());
  if (p == std::string::npos) return 0;
  return std::strtoll(meta.c_str() + p + 1, nullptr, 10);
}

struct Track {
  uint64_t size = 0;
  int64_t step = -1;
  bool fwd_alloc = false;
  size_t alloc_at = 0;
  size_t last_fwd = SIZE_MAX;
  size_t first_bwd = SIZE_MAX;
  bool bwd_read = false;
};

// Analysis::step_peak_needed, by a backward scan: going back in time, a
// block becomes needed at a read of it and stops being needed at a write of
// all of it (its old bytes are never read) or at its free; at the record's
// end every live block is needed. A touch of unknown mode counts as a read.
// `freed_size`: each free's block size, by the free's event index (ids may
// be reused), from analyze's forward pass.
void needed_peaks(Analysis& a, const std::unordered_map<uint64_t, Track>& live_at_end,
                  const std::unordered_map<size_t, uint64_t>& freed_size) {
  struct State {
    uint64_t size = 0;
    bool needed = false;
  };
  std::unordered_map<uint64_t, State> blocks;
  uint64_t needed = 0;
  for (const auto& [id, t] : live_at_end) {
    blocks[id] = {t.size, true};
    needed += t.size;
  }
  a.step_peak_needed.assign(a.steps, 0);
  auto touch = [&](uint64_t id, uint64_t offset, uint64_t length, uint8_t mode) {
    auto it = blocks.find(id);
    if (it == blocks.end()) return;
    State& b = it->second;
    const bool whole_write = mode == kModeWrite && offset == 0 && length >= b.size;
    if (mode == kModeWrite && !whole_write) return;  // a part written: the rest may be read
    const bool want = !whole_write;
    if (b.needed == want) return;
    b.needed = want;
    if (want)
      needed += b.size;
    else
      needed -= b.size;
  };
  for (size_t i = a.events.size(); i-- > 0;) {
    const Event& ev = a.events[i];
    if (const auto* f = std::get_if<FreeRec>(&ev)) {
      blocks[f->alloc] = {freed_size.at(i), false};  // nothing after its free reads it
    } else if (const auto* al = std::get_if<AllocRec>(&ev)) {
      auto it = blocks.find(al->alloc);
      if (it != blocks.end()) {
        if (it->second.needed) needed -= it->second.size;
        blocks.erase(it);
      }
    } else if (const auto* l = std::get_if<LaunchRec>(&ev)) {
      // Writes first: a launch that reads and writes a block needs its bytes.
      for (const TouchRec& t : l->touches)
        if (t.mode == kModeWrite) touch(t.alloc, t.offset, t.length, t.mode);
      for (const TouchRec& t : l->touches)
        if (t.mode != kModeWrite) touch(t.alloc, t.offset, t.length, t.mode);
    } else if (const auto* c = std::get_if<CopyRec>(&ev)) {
      if (c->dst.alloc) touch(c->dst.alloc, c->dst.offset, c->bytes, kModeWrite);
      if (c->src.alloc) touch(c->src.alloc, c->src.offset, c->bytes, kModeRead);
    }
    const int64_t s = a.step[i];
    if (s >= 0) a.step_peak_needed[s] = std::max(a.step_peak_needed[s], needed);
  }
}

}  // namespace

bool analyze(const std::string& path, int layers, Analysis& a, std::string& error) {
  Reader rd;
  if (!rd.open(path)) {
    error = rd.error().to_string();
    return false;
  }
  a.meta = rd.meta();
  Event e;
  std::vector<size_t> launch_at;  // launch ordinal -> event index
  for (;;) {
    const auto s = rd.next(e);
    if (s == Reader::Status::kEnd) break;
    if (s == Reader::Status::kError) {
      error = rd.error().to_string();
      return false;
    }
    if (auto* d = std::get_if<DurationRec>(&e)) {
      std::get<LaunchRec>(a.events[launch_at[d->launch]]).duration_ns = d->duration_ns;
      continue;
    }
    if (auto* st = std::get_if<StringRec>(&e)) a.names[st->id] = st->text;
    if (std::holds_alternative<LaunchRec>(e)) launch_at.push_back(a.events.size());
    a.events.push_back(std::move(e));
  }

  // --layers, else the meta's "layers" or "num_layers", else 8. Each step
  // keeps one event index per layer: a meta claiming 2^31 layers once made
  // that gigabytes (and atoi() wrapped larger numbers).
  int64_t want = layers;
  for (const char* key : {"layers", "num_layers"}) {
    if (want > 0) break;
    want = meta_int(a.meta, key);
    if (want > kMaxLayers) {
      error = "offset 16: the meta's \"" + std::string(key) + "\" is " + std::to_string(want) +
              ", more than the " + std::to_string(kMaxLayers) + " layers the replayer handles";
      return false;
    }
  }
  if (want > kMaxLayers) {
    error = "--layers " + std::to_string(want) + " is more than " + std::to_string(kMaxLayers);
    return false;
  }
  a.layers = want > 0 ? static_cast<int>(want) : 8;

  const size_t n = a.events.size();
  a.phase.resize(n);
  a.step.resize(n);
  uint8_t phase = 0;
  int64_t step = -1;
  uint64_t live = 0;
  std::unordered_map<uint64_t, Track> track;
  std::unordered_map<size_t, uint64_t> freed_size;  // by the free's event index
  std::vector<size_t> fwd_launches;                 // of the current step
  auto finish = [&](uint64_t id, const Track& t) {
    if (!t.fwd_alloc || !t.bwd_read || t.first_bwd == SIZE_MAX) return;
    Analysis::Saved s;
    s.alloc = id;
    s.size = t.size;
    s.last_fwd = t.last_fwd == SIZE_MAX ? t.alloc_at : t.last_fwd;
    s.first_bwd = t.first_bwd;
    if (s.first_bwd <= s.last_fwd) return;
    a.saved.push_back(s);
  };
  auto end_step_layers = [&]() {
    // Cut the step's forward launches into `layers` equal spans.
    std::vector<size_t> ends;
    const size_t m = fwd_launches.size();
    for (int l = 0; l < a.layers && m > 0; ++l) {
      const size_t last = std::min(m, (static_cast<size_t>(l) + 1) * m / a.layers);
      ends.push_back(last == 0 ? fwd_launches[0] : fwd_launches[last - 1]);
    }
    a.layer_end.push_back(std::move(ends));
    fwd_launches.clear();
  };
  auto touch = [&](uint64_t id, uint8_t mode, size_t i) {
    auto it = track.find(id);
    if (it == track.end()) return;
    Track& t = it->second;
    if (t.step != step) return;
    if (phase == 1) t.last_fwd = i;
    if (phase == 2 && t.first_bwd == SIZE_MAX) {
      t.first_bwd = i;
      t.bwd_read = mode != kModeWrite;
    }
  };
  for (size_t i = 0; i < n; ++i) {
    Event& ev = a.events[i];
    if (auto* st = std::get_if<StepRec>(&ev)) {
      if (step >= 0) end_step_layers();
      ++step;
      (void)st;
      phase = 0;
      a.compute_ns.push_back({});
      a.step_peak_live.push_back(live);
    } else if (auto* p = std::get_if<PhaseRec>(&ev)) {
      phase = static_cast<uint8_t>(p->phase);
      a.has_phases = true;
    }
    a.phase[i] = phase;
    a.step[i] = step;
    if (auto* al = std::get_if<AllocRec>(&ev)) {
      live += al->size;
      a.peak_live_bytes = std::max(a.peak_live_bytes, live);
      if (step >= 0) a.step_peak_live[step] = std::max(a.step_peak_live[step], live);
      Track t;
      t.size = al->size;
      t.step = step;
      t.fwd_alloc = phase == 1 && step >= 0;
      t.alloc_at = i;
      track[al->alloc] = t;
    } else if (auto* f = std::get_if<FreeRec>(&ev)) {
      auto it = track.find(f->alloc);
      live -= it->second.size;
      freed_size[i] = it->second.size;
      finish(f->alloc, it->second);
      track.erase(it);
    } else if (auto* l = std::get_if<LaunchRec>(&ev)) {
      if (step >= 0) a.compute_ns[step][phase] += l->duration_ns;
      if (phase == 1 && step >= 0) fwd_launches.push_back(i);
      for (const TouchRec& t : l->touches) touch(t.alloc, t.mode, i);
    } else if (auto* c = std::get_if<CopyRec>(&ev)) {
      if (step >= 0) a.compute_ns[step][phase] += c->duration_ns;
      if (c->dst.alloc) touch(c->dst.alloc, kModeWrite, i);
      if (c->src.alloc) touch(c->src.alloc, kModeRead, i);
    }
  }
  if (step >= 0) end_step_layers();
  for (auto& [id, t] : track) finish(id, t);
  a.steps = static_cast<uint64_t>(step + 1);
  needed_peaks(a, track, freed_size);

  // The layer of each saved tensor: the span of its last forward touch.
  for (Analysis::Saved& s : a.saved) {
    const auto& ends = a.layer_end[static_cast<size_t>(a.step[s.last_fwd])];
    s.layer = 0;
    while (s.layer + 1 < static_cast<int>(ends.size()) && ends[s.layer] < s.last_fwd) ++s.layer;
  }
  std::sort(a.saved.begin(), a.saved.end(),
            [](const auto& x, const auto& y) { return x.last_fwd < y.last_fwd; });
  return true;
}

}  // namespace replay
