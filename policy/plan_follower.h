// Carries a step plan (planner.h) out, keyed on the launch count: as each
// launch of the step is queued, which blocks the plan evicts after it and
// which it brings back at it. Pure, like the planner: the allocator asks at
// each launch and acts on the live blocks the names stand for; a block that
// is not where the plan expects it (used early, freed, never evicted) is
// skipped, so a wrong plan costs time on the on-demand path, never a byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "planner.h"

namespace spillway::policy {

class PlanFollower {
 public:
  struct Due {
    uint64_t block;     // Move::block: the name in the plan's model
    uint32_t next_use;  // the launch index it is used at next (kNever: none)
  };

  // The plan `p` for the step starting now, made from model `m`. Blocks
  // that live across steps are brought back where the plan has them on the
  // device at the step's start: those whose gap wraps the step's end
  // (prefetch_at >= the model's length) at their prefetch_at in this step's
  // numbering, the others before their first use (from launch 0). In a
  // steady state these are the prefetches the last plan named for this step;
  // in the first planned step they bring back what the unplanned one left on
  // the host. Started mid-step, at launch `from`, the moves due before it
  // are skipped: taken all at once they would start a burst of copies that
  // the step's next launches wait for, and an unplanned step has already
  // made its own room.
  void start(const StepModel& m, const Plan& p, uint32_t from = 0);
  // No plan: nothing is due.
  void stop();
  // The same plan again, from the step's start (a step like the last).
  void restart() { next_evict_ = next_prefetch_ = 0; }
  bool active() const { return active_; }

  // The evictions due once launch `at` (from 0) is queued: evict_after <= at,
  // each named once.
  void evictions_due(uint32_t at, std::vector<Due>* out);
  // The prefetches due when launch `at` is about to be queued:
  // prefetch_at <= at, each named once.
  void prefetches_due(uint32_t at, std::vector<Due>* out);

  size_t planned() const { return evict_.size(); }

  // Whether the step being run is still the one the plan was made for,
  // judged by what it has allocated: `allocated` bytes (granule multiples,
  // the step's blocks only) before launch `at`, against what the model had
  // allocated between its launches at-2 and at (an allocation among several
  // between two launches, or before the first), within an eighth or `slack`
  // bytes, whichever is more.
  // A plan carried into a step of other sizes (a batch of other sequence
  // lengths after two alike ones) evicts and prefetches the wrong blocks.
  bool allocations_match(uint32_t at, uint64_t allocated, uint64_t slack) const;

 private:
  struct Entry {
    uint32_t at;  // evict_after, or prefetch_at
    Due due;
  };
  std::vector<Entry> evict_, prefetch_;  // each sorted by `at`
  // The model's step blocks' bytes allocated by each launch index, summed.
  std::vector<uint64_t> allocated_by_;
  size_t next_evict_ = 0, next_prefetch_ = 0;
  bool active_ = false;
};

}  // namespace spillway::policy
