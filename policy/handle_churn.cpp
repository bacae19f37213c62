// handle_churn.h's model, replayed over three steps back to back (the last
// one reported, as predict does), launch by launch: the handles of evictions
// done (an eviction queued after launch e is taken as done before launch
// e + 1: the copies' timing is predict's, not this count's), the frees, the
// allocations, then the prefetches.
#include "handle_churn.h"

#include <algorithm>
#include <limits>
#include <map>
#include <unordered_map>

namespace spillway::policy {
namespace {

constexpr int kSteps = 3;
constexpr int64_t kNoNeed = std::numeric_limits<int64_t>::max();

struct Sizes {
  uint64_t cached = 0;         // freed blocks keeping their mapped handle
  uint64_t pooled = 0;         // evicted blocks' handles, unmapped
  std::vector<int64_t> needs;  // launches taking a handle of this size, ascending
  size_t next = 0;             // the first need not yet taken
  int64_t next_need() const { return next < needs.size() ? needs[next] : kNoNeed; }
};

}  // namespace

HandleChurn handle_churn(const StepModel& m, const std::vector<Move>& moves, uint64_t cap,
                         const VmmCallCosts& c) {
  HandleChurn out;
  const auto L = static_cast<uint32_t>(m.launch_ns.size());
  out.job_ns.assign(L, 0);
  out.mover_ns.assign(L, 0);
  if (L == 0) return out;
  const int64_t N = int64_t{L} * kSteps;

  const size_t G = m.blocks.size();
  std::vector<uint32_t> begin(G), end(G);
  std::unordered_map<uint64_t, uint32_t> index;
  for (uint32_t b = 0; b < G; ++b) {
    const StepModel::Block& k = m.blocks[b];
    begin[b] = k.carried ? 0 : std::min(k.alloc, L);
    end[b] = k.carried ? L : std::min(k.free, L);
    index.emplace(k.id, b);
  }
  // Events by replayed launch.
  std::vector<std::vector<uint32_t>> allocs(N + 1), frees(N + 1), evicted(N + 1), fetches(N + 1);
  std::vector<uint8_t> out_at_start(G, 0);
  for (uint32_t b = 0; b < G; ++b) {
    if (m.blocks[b].carried || begin[b] >= end[b]) continue;
    for (int64_t k = 0; k < kSteps; ++k) {
      allocs[k * L + begin[b]].push_back(b);
      frees[k * L + end[b]].push_back(b);  // end == L: before the next step's first launch
    }
  }
  for (const Move& mv : moves) {
    auto it = index.find(mv.block);
    if (it == index.end() || mv.evict_after >= L) continue;
    const uint32_t b = it->second;
    const bool dead = mv.prefetch_at == Move::kNever;
    // A carried block's prefetch in the next step: out when the replay starts.
    if (!dead && mv.prefetch_at >= L && m.blocks[b].carried) {
      out_at_start[b] = 1;
      fetches[mv.prefetch_at - L].push_back(b);
    }
    for (int64_t k = 0; k < kSteps; ++k) {
      const int64_t e = k * L + mv.evict_after + 1;
      if (e < N) evicted[e].push_back(b);
      if (dead) continue;
      const int64_t p = k * L + mv.prefetch_at;
      if (p < N) fetches[p].push_back(b);
    }
  }

  std::map<uint64_t, Sizes> sizes;
  for (int64_t g = 0; g < N; ++g) {
    for (uint32_t b : allocs[g]) sizes[m.blocks[b].bytes].needs.push_back(g);
    for (uint32_t b : fetches[g]) sizes[m.blocks[b].bytes].needs.push_back(g);
  }

  std::vector<uint8_t> in(G, 0);
  uint64_t resident = m.pinned_bytes, held = 0;  // held: free handles, cached or pooled
  for (uint32_t b = 0; b < G; ++b)
    if (m.blocks[b].carried && !out_at_start[b]) {
      in[b] = 1;
      resident += m.blocks[b].bytes;
    }

  const int64_t last = N - L;
  auto counted = [&](int64_t g, uint64_t& n) {
    if (g >= last) ++n;
  };
  // Free handles go, the size needed last first, until the cap is kept.
  auto make_room = [&](int64_t g, uint64_t& ns) {
    while (resident + held > cap && held > 0) {
      Sizes* victim = nullptr;
      uint64_t victim_size = 0;
      for (auto& [size, s] : sizes)
        if ((s.cached || s.pooled) && (!victim || s.next_need() > victim->next_need())) {
          victim = &s;
          victim_size = size;
        }
      if (victim->pooled) {
        victim->pooled -= victim_size;
      } else {
        victim->cached -= victim_size;
        ns += c.unmap_ns;
        counted(g, out.unmaps);
      }
      held -= victim_size;
      ns += c.release_ns;
      counted(g, out.releases);
    }
  };
  for (int64_t g = 0; g < N; ++g) {
    const auto i = static_cast<uint32_t>(g % L);
    for (uint32_t b : evicted[g]) {
      if (!in[b]) continue;
      in[b] = 0;
      const uint64_t s = m.blocks[b].bytes;
      resident -= s;
      sizes[s].pooled += s;
      held += s;
    }
    for (uint32_t b : frees[g]) {
      if (!in[b]) continue;  // out: its host copy goes, its handle is pooled already
      in[b] = 0;
      const uint64_t s = m.blocks[b].bytes;
      resident -= s;
      sizes[s].cached += s;
      held += s;
    }
    uint64_t job = 0, mover = 0;
    for (uint32_t b : allocs[g]) {
      const uint64_t s = m.blocks[b].bytes;
      Sizes& z = sizes[s];
      ++z.next;
      if (z.cached) {
        z.cached -= s;
        held -= s;
        counted(g, out.reused);
      } else {
        if (z.pooled) {
          z.pooled -= s;
          held -= s;
        } else {
          job += c.create_ns;
          counted(g, out.creates);
        }
        job += c.map_ns + c.grant_ns;
        counted(g, out.maps);
      }
      in[b] = 1;
      resident += s;
      make_room(g, job);
    }
    for (uint32_t b : fetches[g]) {
      const uint64_t s = m.blocks[b].bytes;
      Sizes& z = sizes[s];
      ++z.next;
      if (in[b]) continue;
      if (z.pooled) {  // its map and grant are the move's swap
        z.pooled -= s;
        held -= s;
        counted(g, out.reused);
      } else if (z.cached) {
        z.cached -= s;
        held -= s;
        mover += c.unmap_ns;
        counted(g, out.unmaps);
      } else {
        mover += c.create_ns;
        counted(g, out.creates);
      }
      in[b] = 1;
      resident += s;
      make_room(g, mover);
    }
    if (g >= last) {
      out.job_ns[i] += job;
      out.mover_ns[i] += mover;
    }
  }
  return out;
}

}  // namespace spillway::policy
