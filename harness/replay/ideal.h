// The ideal a run is compared with (issue 12 item 5): the step planner
// (policy/planner.h) given one step of the trace exactly, as a model of
// launches and large blocks. Every time is simulated.
#pragma once

#include <cstdint>

#include "handle_churn.h"
#include "planner.h"
#include "replay.h"

namespace replay {

// How the trace's allocations become the planner's blocks: what spillway
// does with them (docs/config.md: SPILLWAY_MIN_BLOCK, granule, small chunks)
// and the host's time per launch (SIMCUDA_LAUNCH_NS).
struct ModelRules {
  uint64_t min_block = 1ull << 20;
  uint64_t granule = 2ull << 20;
  uint64_t chunk = 2ull << 20;
  uint64_t launch_host_ns = 4000;
};

// Step `step` of the trace: its launches (kernels, copies and sets, with
// their recorded durations), its large allocations as blocks (those live
// when it starts from launch 0; live throughout it: carried, unless not
// `carry`), and the peak of its small allocations, in whole chunks, as
// pinned bytes.
spillway::policy::StepModel step_model(const Analysis& a, uint64_t step, const ModelRules& r,
                                       bool carry = true);

struct Ideal {
  bool valid = false;
  spillway::policy::Plan plan;           // under the budget
  spillway::policy::Plan unconstrained;  // the same step with no budget: nothing moves
  // The same plan with device memory in handles of exact sizes: its VMM
  // calls charged (handle_churn.h) at the given costs. Only with costs.
  spillway::policy::Plan handles;
  spillway::policy::HandleChurn churn;
  // With `without_foresight`: the plan of the same step with nothing
  // carried, every block live at its start on the device there and nothing
  // moved for it in the step before. The cyclic plan may move, at the end
  // of the step before, bytes for this one (a carried block's gap wraps);
  // this one is what a plan made at the step's start, with the step's exact
  // future but no sight of it before, could do (a job's first repeat, a
  // two-step record's last step), and `fresh_unconstrained` its step with
  // nothing moved.
  spillway::policy::Plan fresh;
  spillway::policy::Plan fresh_unconstrained;
};

Ideal ideal(const Analysis& a, uint64_t step, const ModelRules& r,
            const spillway::policy::PlanOptions& o, const spillway::policy::VmmCallCosts& c = {},
            bool without_foresight = false);

}  // namespace replay
