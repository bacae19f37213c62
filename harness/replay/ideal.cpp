// The ideal of issue 12 item 5: the step planner (policy/planner.h) given the
// exact future of one step of the trace, as spillway's mover would carry it
// out. Its plan's predicted cost is what a run with perfect prediction could
// reach under the planner's rules, not a proof of optimality: the replayer
// reports it beside a lower bound so that the distance between the two is
// visible too.
#include <algorithm>
#include <unordered_map>

#include "ideal.h"

namespace replay {

using namespace spillway::trace;

namespace {

uint64_t round_up(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

}  // namespace

spillway::policy::StepModel step_model(const Analysis& a, uint64_t step, const ModelRules& r,
                                       bool carry) {
  using spillway::policy::StepModel;
  StepModel m;
  m.launch_host_ns = r.launch_host_ns;
  std::unordered_map<uint64_t, size_t> block_of;  // alloc id -> index in m.blocks
  std::unordered_map<uint64_t, uint64_t> live;    // every live allocation: id -> size
  uint64_t small_live = 0, small_peak = 0;
  auto add_block = [&](uint64_t id, uint64_t size, uint32_t at) {
    StepModel::Block b;
    b.id = id;
    b.bytes = round_up(size, r.granule);
    b.alloc = at;
    block_of[id] = m.blocks.size();
    m.blocks.push_back(std::move(b));
  };
  auto use = [&](uint64_t id, uint32_t at) {
    auto it = block_of.find(id);
    if (it == block_of.end()) return;
    std::vector<uint32_t>& u = m.blocks[it->second].uses;
    if (u.empty() || u.back() != at) u.push_back(at);
  };
  bool started = false;
  for (size_t i = 0; i < a.events.size(); ++i) {
    const Event& ev = a.events[i];
    const int64_t s = a.step[i];
    if (s > static_cast<int64_t>(step)) break;
    const auto at = static_cast<uint32_t>(m.launch_ns.size());
    if (s == static_cast<int64_t>(step) && !started) {
      // Whatever is live when the step starts is live from its first launch.
      started = true;
      for (const auto& [id, size] : live) {
        if (size < r.min_block)
          small_live += size;
        else
          add_block(id, size, 0);
      }
      small_peak = small_live;
    }
    if (const auto* al = std::get_if<AllocRec>(&ev)) {
      live[al->alloc] = al->size;
      if (!started) continue;
      if (al->size >= r.min_block) {
        add_block(al->alloc, al->size, at);
      } else {
        small_live += al->size;
        small_peak = std::max(small_peak, small_live);
      }
    } else if (const auto* f = std::get_if<FreeRec>(&ev)) {
      auto it = live.find(f->alloc);
      if (it == live.end()) continue;
      const uint64_t size = it->second;
      live.erase(it);
      if (!started) continue;
      if (auto b = block_of.find(f->alloc); b != block_of.end())
        m.blocks[b->second].free = at;
      else if (size < r.min_block)
        small_live -= std::min(small_live, size);
    } else if (!started) {
      continue;
    } else if (const auto* l = std::get_if<LaunchRec>(&ev)) {
      for (const TouchRec& t : l->touches) use(t.alloc, at);
      m.launch_ns.push_back(l->duration_ns);
    } else if (const auto* c = std::get_if<CopyRec>(&ev)) {
      if (c->dst.alloc) use(c->dst.alloc, at);
      if (c->src.alloc) use(c->src.alloc, at);
      m.launch_ns.push_back(c->duration_ns);
    }
  }
  m.pinned_bytes = round_up(small_peak, r.chunk);
  for (StepModel::Block& b : m.blocks) {
    // Live through the whole step, from before it to after it: the step
    // repeats its uses (weights, optimizer state).
    b.carried = carry && b.alloc == 0 && b.free == StepModel::kLive;
    // Never used in the step and live throughout: it could leave and never
    // come back in this step; the planner sees that from its empty uses.
  }
  return m;
}

Ideal ideal(const Analysis& a, uint64_t step, const ModelRules& r,
            const spillway::policy::PlanOptions& o, const spillway::policy::VmmCallCosts& c,
            bool without_foresight) {
  Ideal out;
  spillway::policy::StepModel m = step_model(a, step, r);
  if (m.launch_ns.empty()) return out;
  out.plan = spillway::policy::plan_step(m, o);
  spillway::policy::PlanOptions unlimited = o;
  unlimited.budget = UINT64_MAX / 2;
  unlimited.headroom = 0;
  out.unconstrained = spillway::policy::predict(m, unlimited, {});
  out.handles = out.plan;
  if (c.any()) {
    // The plan is the fungible one's, not re-planned for the calls.
    out.churn = spillway::policy::handle_churn(
        m, out.plan.moves, o.budget > o.headroom ? o.budget - o.headroom : 0, c);
    m.host_extra_ns = out.churn.job_ns;
    m.fetch_extra_ns = out.churn.mover_ns;
    out.handles = spillway::policy::predict(m, o, out.plan.moves);
  }
  if (without_foresight) {
    // With nothing carried the two models are one: the plan is the same.
    const bool any_carried =
        std::any_of(m.blocks.begin(), m.blocks.end(), [](const auto& b) { return b.carried; });
    out.fresh = out.plan;
    out.fresh_unconstrained = out.unconstrained;
    if (any_carried) {
      const spillway::policy::StepModel fresh = step_model(a, step, r, false);
      out.fresh = spillway::policy::plan_step(fresh, o);
      out.fresh_unconstrained = spillway::policy::predict(fresh, unlimited, {});
    }
  }
  out.valid = true;
  return out;
}

}  // namespace replay
