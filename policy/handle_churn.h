// What carrying a step's plan out costs in VMM driver calls when device
// memory comes as handles of exact sizes.
//
// The planner (planner.h) treats freed device memory as fungible: any freed
// byte serves any later allocation or prefetch. A VMM allocator cannot do
// that: a handle is mapped whole (a part of one is refused, docs/gpu.md run
// 17), and a block made of several handles pays each mapping's access grant
// and unmap (run 18), so a block is one handle of its size. Under a full
// budget an allocation or prefetch whose size no free handle has must
// release others (unmap, release) and create its own (create, map, grant).
// `handle_churn` counts those calls for a plan, keeping the free handles
// whose size is needed again soonest (Belady, with the plan's exact future),
// and says on which thread and before which launch each is made; the
// planner's `predict`, given them (StepModel::host_extra_ns,
// fetch_extra_ns), costs the plan with them.
//
// The model (docs/residency.md, session 17): a freed block keeps its handle
// mapped at its address (a cached block: a later allocation of its size
// takes it with no call); an evicted block's handle goes to a pool once its
// eviction is done (a later prefetch of its size maps it: part of the move's
// swap, already PlanOptions::move_host_ns); an allocation takes a cached
// block of its size, else a pooled handle (map, grant), else a new one
// (create, map, grant); a prefetch takes a pooled handle, else a cached
// block's (an unmap more), else a new one (a create more). Whenever the
// resident bytes and the free handles exceed the cap, free handles are
// released, those of the size needed last first (a pooled handle: release;
// a cached block: unmap, release), by the thread whose take crossed it. No
// block is split and no handle serves another size.
//
// Pure: no CUDA, no threads, no clock.
#pragma once

#include <cstdint>
#include <vector>

#include "planner.h"

namespace spillway::policy {

// Host time of each VMM entry point, ns.
struct VmmCallCosts {
  uint64_t create_ns = 0, map_ns = 0, grant_ns = 0, unmap_ns = 0, release_ns = 0;
  bool any() const { return create_ns | map_ns | grant_ns | unmap_ns | release_ns; }
};

struct HandleChurn {
  // Per launch of the step (steady state): host time the job's thread spends
  // before issuing it (its allocations, and the releases that make room for
  // them), and time the mover spends before the copies of the prefetches
  // issued there (their device handles, and the releases for them).
  std::vector<uint64_t> job_ns, mover_ns;
  // Per step, steady state: calls made, and takes served with no call.
  uint64_t creates = 0, maps = 0, unmaps = 0, releases = 0, reused = 0;
};

// `moves` as a Plan's (valid for `m`: plan_step's or predict's); `cap` the
// budget less the headroom.
HandleChurn handle_churn(const StepModel& m, const std::vector<Move>& moves, uint64_t cap,
                         const VmmCallCosts& c);

}  // namespace spillway::policy
