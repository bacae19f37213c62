// The learned schedule of design.md section 7: training repeats, so the
// accesses of the step just ended predict those of the current one. Each
// step's uses are recorded by launch index (counted from the step's start),
// per block, and a block of the current step finds its predecessor:
// - a block made during the step is named by its first use: the launch's
//   index in the step and the block's place among the blocks that launch
//   touches. The kernel sequence repeats even when sequence lengths (and so
//   sizes, and which tensors are large enough to be spillway's) change;
// - a block that lives across steps (weights, optimizer state) is itself.
// Victims are chosen furthest predicted next use first (Belady); for a block
// with no predecessor, by how long it has gone unused; before a step has
// been seen, by first_step_order. A prediction is only ever a preference: a
// wrong one costs a transfer, never a byte (the allocator restores whatever
// is used).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "planner.h"
#include "victims.h"

namespace spillway::policy {

class ScheduleChooser final : public VictimChooser {
 public:
  // `max_units` bounds one step's record: a use costs 1, each block named in
  // it kKeyUnits more (its map node and vector). Past it the step is not
  // learned and the choice is least recent use: what bounds memory in a job
  // whose steps are huge or never marked.
  static constexpr size_t kKeyUnits = 16;
  // About 16 MiB of record; the previous step's index by launch (upcoming)
  // adds 8 bytes a use, so at most about 48 MiB in all.
  static constexpr size_t kDefaultMaxUnits = size_t{1} << 22;
  explicit ScheduleChooser(size_t max_units = kDefaultMaxUnits) : max_units_(max_units) {}

  void on_alloc(uint64_t id) override;
  void on_free(uint64_t id) override;
  void on_step(uint64_t end) override;
  void on_access(const Use& a) override;
  std::vector<uint64_t> choose(std::vector<Candidate> candidates, size_t need) override;
  // Near a step's end the window reaches into the next step: blocks that
  // live across steps are named for its first launches.
  void upcoming(uint32_t ahead, std::vector<uint64_t>* ids) override;
  std::vector<uint64_t> choose_beyond(std::vector<Candidate> candidates, size_t need,
                                      uint64_t beyond) override;

  // Launches from now to the block's next predicted use. For a block made in
  // this step whose predecessor was used no more: kNever (it will likely be
  // freed first). For one that lives across steps: its first use in the next
  // step. kUnknown before its first use, without a predecessor, or before a
  // step was seen.
  static constexpr uint64_t kNever = UINT64_MAX;
  static constexpr uint64_t kUnknown = UINT64_MAX - 1;
  uint64_t next_use(uint64_t id) const;
  bool learned() const { return have_prev_; }

  // The step just ended as the planner's model (planner.h), for the next
  // step: each block once, its size (the largest requested, rounded up to
  // `granule`), its live range and uses by launch index from 0. Blocks live
  // throughout it are `carried`. Launch durations are not known here: every
  // launch_ns is 0 for the caller to fill. Empty before a step was learned.
  // Approximations: launches that touched no large block are counted but an
  // allocation or free between them is placed at the last one that did, and
  // a block freed without a use in its step is left out.
  StepModel learned_step(uint64_t granule) const;
  // Its launch count (learned_step's launch_ns.size()), without building it.
  uint32_t learned_launches() const { return have_prev_ ? prev_len_ : 0; }
  // The launches of the step just ended that learned_step leaves out, as
  // indices from 0 in that step's own numbering, ascending: those that only
  // made blocks that stay (the optimizer's state filled with zeros in the
  // first step), which the next step will not repeat (drop_making_launches).
  const std::vector<uint32_t>& dropped_launches() const { return dropped_; }
  // The name a live block's Move::block has in learned_step's model (its
  // predecessor's), or 0 if it has none yet (not used yet in this step).
  uint64_t model_id(uint64_t id) const;
  // The live block a name of learned_step's model stands for now, or 0:
  // one made in the step only once its first use named it.
  uint64_t live_block(uint64_t model_id) const;
  // Launch number `launch` (Use::launch) as an index from 0 in this step's
  // own numbering (what the next model is numbered by), and in that of
  // learned_step's model (the steps aligned). 0 before the step's first.
  uint32_t step_index(uint64_t launch) const {
    const uint32_t n = since_start(launch);
    return n > 0 ? n - 1 : 0;
  }
  uint32_t model_index(uint64_t launch) const {
    const int64_t t = int64_t{since_start(launch)} + offset_;
    return t > 1 ? static_cast<uint32_t>(t - 1) : 0;
  }
  size_t recorded() const { return recording_ ? recorded_ : 0; }  // units, this step

  // Before any step is learned (a job's first), the blocks unused for more
  // than kFirstStepGuard launches go first, the most recently used of them
  // first, then the rest, least recently used first. Least recent use alone
  // evicts what PyTorch's optimizer loop reads next (the parameters it has
  // not reached are those used longest ago: llama7b's first step moved over
  // 4x the ideal's bytes); the most recent use alone evicts what the next
  // launches read (a forward's newest activation: a first step under
  // pressure in its forward up to twice as slow). Blocks idle a while,
  // newest first, are the loop's parameters just updated, and in a forward
  // activations kept for its backward, not those the next launches read
  // (docs/residency.md, sessions 30 and 32).
  static constexpr uint64_t kFirstStepGuard = 64;

 private:
  // How a block is known across steps.
  struct Key {
    bool carried = false;  // lived across a step boundary: known by its id
    uint64_t number = 0;   // its id, or (first-use launch << 16 | place in it)
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return k.number * 0x9E3779B97F4A7C15ull ^ k.carried; }
  };
  // One step's record of a block: the launch indices of its uses, in order
  // (from 1: launch numbers count from the step's start), its size and live
  // range (kLive: live at the step's end).
  struct Record {
    std::vector<uint32_t> uses;
    uint64_t bytes = 0;
    uint32_t alloc = 0;  // launches seen before its allocation (made in the step)
    uint32_t free = StepModel::kLive;
    bool made = false;  // allocated in the step (else live from before it)
  };
  using Uses = std::unordered_map<Key, Record, KeyHash>;
  static uint64_t model_id(const Key& k) { return k.carried ? k.number : k.number * 2 + 1; }

  // Launches since the step began (launch numbers count from its start).
  uint32_t since_start(uint64_t launch) const {
    return static_cast<uint32_t>(launch - std::min(launch, step_start_));
  }
  uint32_t now() const { return since_start(last_launch_); }
  // Now in the previous step's launch numbers (the steps aligned).
  uint64_t now_prev() const {
    const int64_t t = int64_t{now()} + offset_;
    return t > 0 ? static_cast<uint64_t>(t) : 0;
  }
  const std::vector<uint32_t>* predecessor_uses(const Key& k) const;

  struct Tracked {
    Key key;
    bool keyed;            // used (or carried) yet
    uint64_t last_launch;  // its latest use (or its allocation)
    // Its record in cur_ once it has one this step (so a use costs one
    // lookup, not two); reset when cur_ is replaced.
    Record* uses;
    uint64_t bytes = 0;     // the largest use's size
    uint32_t alloc_at = 0;  // launches seen in its step before its allocation
    bool made = false;      // allocated in the current step
    // A made block's name in the previous step: its first use's place moved
    // by the steps' alignment then (`key` names it for the next step).
    Key prev_key{};
    uint32_t nth = 0;  // launches that used it in this step so far
  };
  uint64_t next_use(const Tracked& l) const;
  // Candidates by next predicted use, furthest first, then first_covering;
  // with `beyond` (not kUnknown) only those predicted used after it.
  std::vector<uint64_t> furthest_first(std::vector<Candidate> c, size_t need,
                                       uint64_t beyond) const;
  std::vector<uint64_t> first_step_order(std::vector<Candidate> c, size_t need) const;
  // The candidates by rank, highest first (ties: the older use first), as
  // many as cover `need`.
  static std::vector<uint64_t> highest_first(std::vector<std::pair<uint64_t, Candidate>> ranked,
                                             size_t need);
  // Launches since the block's latest use (or its allocation).
  uint64_t idle_launches(const Tracked& l) const {
    return last_launch_ - std::min(last_launch_, l.last_launch);
  }
  void record(Tracked& l, uint32_t at);
  Record& record_of(Tracked& l);
  // At a step's end, of `n` launches: drops from cur_ the launches that
  // made a block still live and touched, besides, only blocks live from
  // before the step (a weight at least), and numbers the rest again; the
  // blocks they made count as live from before the step. Returns the
  // launches left.
  uint32_t drop_making_launches(uint32_t n);

  std::unordered_map<uint64_t, Tracked> live_;  // by block id
  // upcoming(): the previous step's uses by launch number (from 1), the
  // blocks made in this step by the key their first use gave them, and the
  // launch numbers of this step already named.
  std::vector<std::vector<const Uses::value_type*>> by_launch_;  // into prev_
  std::unordered_map<Key, uint64_t, KeyHash> named_;
  uint64_t scanned_ = 0;  // in the previous step's launch numbers
  // The previous step's launch number less this one's at the latest use of
  // a block live across both: steps whose launches differ in number (the
  // first one creates the optimizer's state, say) stay aligned.
  int64_t offset_ = 0;
  uint64_t cur_launch_ = 0;  // the launch of the latest access
  uint32_t pos_ = 0;         // ... and its place in that launch
  uint32_t prev_len_ = 0;    // launches in the previous step (dropped_ left out)
  std::vector<uint32_t> dropped_;
  Uses cur_, prev_;
  bool have_prev_ = false;
  bool recording_ = true;
  size_t recorded_ = 0;
  size_t max_units_;
  // No block was live at the step's start (the first step, before any mark):
  // drop_making_launches then tells the set-up's blocks by first_reuse_.
  bool fresh_ = true;
  // The step's first launch (from 1) to use a block an earlier launch of the
  // step used; 0 until one did.
  uint32_t first_reuse_ = 0;
  uint64_t step_start_ = 0;   // the last launch number of the step before
  uint64_t last_launch_ = 0;  // latest launch number seen (or the step's start)
};

}  // namespace spillway::policy
