// The step planner (issue 12 item 3): from one training step, as launches
// and the large blocks they use, and the budget, it decides after which
// launch each block is evicted and at which launch its prefetch is issued so
// that it is back before its next use, keeping the predicted resident bytes
// within the budget less the headroom at every launch, minimizing first the
// stall and then the bytes moved. It also predicts what its plan costs: the
// step's time with the copies it queues, on one compute engine and one copy
// engine per direction (the simulator's rules, docs/sim.md).
//
// Pure: no CUDA, no threads, no clock, no I/O; the same model gives the same
// plan. The allocator's mover carries a plan out keyed on the launch count;
// the replayer gives it a trace's exact future to compute the ideal.
//
// Launch indices count from the step's start: launch i is the i-th launch
// (kernel, copy or set) of the step, 0 <= i < L where L = launch_ns.size().
// The step repeats: a block live across steps (`carried`) is used again at
// its first use in the next step, so its gap from its last use to that one
// wraps the step's end. An index i >= L in a plan means launch i - L of the
// next step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace spillway::policy {

struct StepModel {
  // The duration of each launch (ns), in order: measured (CUPTI activity
  // records on a GPU, the simulator's clock here) or a trace's.
  std::vector<uint64_t> launch_ns;
  // Host time to issue one launch (ns): a step is never shorter than L times
  // this (a job whose kernels are shorter than its launches is host-bound).
  uint64_t launch_host_ns = 0;
  // Device bytes that never move (small blocks, pooled chunks): they count
  // against the budget at every launch.
  uint64_t pinned_bytes = 0;
  // Optional, per launch (empty: none): host time the job's thread spends
  // before issuing launch i beyond launch_host_ns (its allocations' driver
  // calls), and time the mover spends before the copies of the prefetches
  // issued at launch i (making their device memory): handle_churn.h.
  std::vector<uint64_t> host_extra_ns, fetch_extra_ns;

  static constexpr uint32_t kLive = UINT32_MAX;
  struct Block {
    uint64_t id = 0;     // the caller's name for it; Move::block (unique in the model)
    uint64_t bytes = 0;  // device bytes it holds (a granule multiple)
    // Live for launches [alloc, free): allocated before launch `alloc`,
    // freed before launch `free`. A carried block has alloc 0 and free kLive
    // (it is taken as live all step, whatever they say); a step's block with
    // free >= L is taken as freed at the step's end.
    uint32_t alloc = 0;
    uint32_t free = kLive;
    bool carried = false;  // lives across steps: its uses repeat every step
    // Launch indices, ascending, each in [alloc, free) (others are ignored).
    // The block must be resident at each, and at `alloc` (allocating takes
    // the memory); a carried block with no use is never moved.
    std::vector<uint32_t> uses;
  };
  std::vector<Block> blocks;
};

struct PlanOptions {
  uint64_t budget = 0;    // device bytes for the blocks and pinned_bytes
  uint64_t headroom = 0;  // kept free at every launch
  // Link rates in bytes per ns (1 GB/s = 1 byte/ns): each direction alone,
  // and each direction while the other is busy (docs/sim.md's defaults).
  double d2h_bytes_per_ns = 55, h2d_bytes_per_ns = 55, bidir_bytes_per_ns = 45;
  // Host time to swap one moved block's mappings once its copy is done (its
  // VMM calls: an unmap, a map and an access grant, about 45 us each on an
  // H100, docs/gpu.md check (a)), made on one thread for every move (the
  // mover's): an eviction's memory is free, and a prefetch usable, only
  // after its swap. 0: free, as the simulator's default costs. The driver
  // makes VMM calls one at a time (docs/gpu.md run 19): swaps and the
  // StepModel's host_extra_ns and fetch_extra_ns take turns.
  uint64_t move_host_ns = 0;
  // Besides the sweeps at the cap (budget - headroom), sweeps at the cap
  // less these fractions, each plan still judged at the true cap: evicting
  // at the last moment (Belady) leaves no room for prefetch windows. On the
  // eight-step records they cut the predicted step by up to 15% (vit_b16,
  // llama7b at 40%; docs/residency.md, session 23).
  std::vector<double> sweep_margins{0.03, 0.06, 0.10, 0.15};
  // false: at each margin only the variant (ready victims first or not,
  // prefetch window) that won at the cap (about 2.2x the time of the cap's
  // sweeps alone on the largest model, for the shim's mover); true: every
  // variant at every margin (5x: the replayer's ideal, offline).
  bool thorough = false;
  // After the candidates, a local search from the best (each move dropped,
  // or its prefetch issued 1, 2, 4, ... launches earlier or later, kept when
  // the replay says the plan is better), at most this many replays (each
  // O(L + moves)). 0: none, as the shim's mover plans (there the polished
  // plans, tuned to the prediction's margins, ran slower on resnet50 at 60%,
  // simulated: docs/residency.md, session 28). The replayer's ideal polishes.
  uint32_t polish_replays = 0;
};

struct Move {
  static constexpr uint32_t kNever = UINT32_MAX;
  uint64_t block = 0;
  // Copy it out once launch `evict_after` (its last use before the gap, or
  // its allocation) is queued; its device memory is free once that copy is
  // done. A carried block's wrapped gap is named by its last use in the step.
  uint32_t evict_after = 0;
  // Issue the copy back when launch `prefetch_at` is reached (its device
  // memory is taken then), so that it lands before launch `next_use`.
  // kNever for both: freed before it is used again (dead data), never copied
  // back. Indices >= L are in the next step (carried blocks).
  uint32_t prefetch_at = kNever;
  uint32_t next_use = kNever;
};

struct Plan {
  std::vector<Move> moves;  // ordered by evict_after, then block
  // Predicted, by replaying the step with the plan's copies on the engines:
  // Steps replayed back to back, the last reported (so a step pays for the
  // copies the one before queued), each launch's figures taken when the host
  // issues it.
  bool fits = false;        // resident bytes <= budget - headroom at every launch
  uint64_t peak_bytes = 0;  // the most resident at any launch
  // The step's time, stalls included: from the end of the step before's last
  // launch to the end of its own (steady state: no synchronisation between
  // steps).
  uint64_t step_ns = 0;
  // Of which launches waited for copies (or memory): step_ns less the same
  // replay's without any copy.
  uint64_t stall_ns = 0;
  uint64_t bytes_out = 0;  // device-to-host bytes per step
  uint64_t bytes_in = 0;   // host-to-device bytes per step
};

// Whether `b` is the step `a` again, as far as a plan goes: the same blocks
// in the same order (names, sizes, live ranges, uses) and the same number of
// launches, whose total time differs by at most 1/`within` (measured
// durations vary from step to step; a plan does not hinge on them), and
// whose pinned bytes differ by at most 1/`within` or `pinned_slack` bytes.
// `within` 1: the blocks and launches alone.
bool same_step(const StepModel& a, const StepModel& b, uint32_t within, uint64_t pinned_slack = 0);

// The plan for the model's next step.
Plan plan_step(const StepModel& m, const PlanOptions& o);

// What a plan costs when carried out on `m` (the planner's own prediction;
// exposed so that a test, or the replayer, can cost a plan it changed).
// Moves it cannot carry out are left out of the plan it returns, and of its
// figures: an unknown block; an evict_after where the block is not live (or,
// carried, before its first use); a next_use that is not the block's first
// use after evict_after (a carried block's first use + L past its last);
// prefetch_at outside (evict_after, next_use]; kNever for a block used again;
// a move starting inside the gap of another.
Plan predict(const StepModel& m, const PlanOptions& o, std::vector<Move> moves);

}  // namespace spillway::policy
