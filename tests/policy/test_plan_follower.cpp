// The plan follower (policy/plan_follower.h) and the names that tie a plan
// to the blocks of the step it is carried out in (ScheduleChooser's
// model_id, live_block, model_index).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "plan_follower.h"
#include "schedule.h"

using spillway::policy::Move;
using spillway::policy::Plan;
using spillway::policy::PlanFollower;
using spillway::policy::ScheduleChooser;
using spillway::policy::StepModel;

namespace {

constexpr uint64_t kMiB = 1ull << 20;

std::vector<uint64_t> blocks(const std::vector<PlanFollower::Due>& d) {
  std::vector<uint64_t> out;
  for (const auto& x : d) out.push_back(x.block);
  return out;
}

StepModel::Block carried(uint64_t id, std::vector<uint32_t> uses) {
  StepModel::Block b;
  b.id = id;
  b.bytes = 2 * kMiB;
  b.carried = true;
  b.uses = std::move(uses);
  return b;
}

}  // namespace

// Each move is due once, at the launch it names: an eviction once its
// evict_after is queued, a prefetch when its prefetch_at is reached; a
// launch skipped (no large block touched) still lets what was due go.
TEST(PlanFollower, EachMoveIsDueOnceAtTheLaunchItNames) {
  StepModel m;
  m.launch_ns.assign(10, 1000);
  StepModel::Block t;  // made in the step, dead after launch 6
  t.id = 7;
  t.bytes = 2 * kMiB;
  t.alloc = 1;
  t.free = 8;
  t.uses = {1, 6};
  m.blocks = {t};
  Plan p;
  p.moves = {{7, 1, 4, 6}, {9, 2, Move::kNever, Move::kNever}};
  PlanFollower f;
  EXPECT_FALSE(f.active());
  f.start(m, p);
  EXPECT_TRUE(f.active());
  std::vector<PlanFollower::Due> d;
  f.evictions_due(0, &d);
  EXPECT_TRUE(d.empty());
  f.evictions_due(1, &d);
  EXPECT_EQ(std::vector<uint64_t>({7}), blocks(d));
  EXPECT_EQ(6u, d[0].next_use);
  d.clear();
  f.evictions_due(1, &d);
  EXPECT_TRUE(d.empty()) << "named once";
  f.evictions_due(5, &d);  // launches 2-4 touched no large block
  EXPECT_EQ(std::vector<uint64_t>({9}), blocks(d));
  EXPECT_EQ(Move::kNever, d[0].next_use) << "dead data: never copied back";
  d.clear();
  f.prefetches_due(3, &d);
  EXPECT_TRUE(d.empty());
  f.prefetches_due(4, &d);
  EXPECT_EQ(std::vector<uint64_t>({7}), blocks(d));
  d.clear();
  f.prefetches_due(9, &d);
  EXPECT_TRUE(d.empty());
  f.stop();
  EXPECT_FALSE(f.active());
  f.evictions_due(100, &d);
  f.prefetches_due(100, &d);
  EXPECT_TRUE(d.empty());
}

// A plan started mid-step (the first one, made by the mover during the step
// it was learned from) takes the moves due from the next launch on and skips
// those due before it: all at once they would start a burst of copies the
// step's next launches wait for.
TEST(PlanFollower, AStartMidStepSkipsTheMovesDueBeforeIt) {
  StepModel m;
  m.launch_ns.assign(10, 1000);
  Plan p;
  p.moves = {{3, 1, 4, 6}, {5, 5, 7, 9}, {8, 6, Move::kNever, Move::kNever}};
  PlanFollower f;
  f.start(m, p, 5);
  std::vector<PlanFollower::Due> d;
  f.evictions_due(9, &d);
  EXPECT_EQ(std::vector<uint64_t>({5, 8}), blocks(d)) << "block 3 left after launch 1: skipped";
  d.clear();
  f.prefetches_due(9, &d);
  EXPECT_EQ(std::vector<uint64_t>({5}), blocks(d)) << "block 3's prefetch at 4: skipped";
  // The next step runs the whole plan.
  f.restart();
  d.clear();
  f.evictions_due(9, &d);
  EXPECT_EQ(std::vector<uint64_t>({3, 5, 8}), blocks(d));
}

// Blocks that live across steps start the step where the plan has them:
// one whose gap wraps the step's end leaves at launch 0 (if it is still on
// the device) and comes back at its prefetch_at in this step's numbering;
// one the plan keeps on the device at the start comes back from launch 0
// (a first planned step finds what the unplanned one left on the host).
TEST(PlanFollower, CarriedBlocksStartTheStepWhereThePlanHasThem) {
  StepModel m;
  m.launch_ns.assign(10, 1000);
  m.blocks = {carried(2, {1, 8}), carried(4, {3}), carried(6, {})};
  Plan p;
  // Block 2 leaves after launch 8 and is back for launch 1 of the next step
  // (index 11), its copy issued at launch 0 of that step (index 10).
  p.moves = {{2, 8, 10, 11}};
  PlanFollower f;
  f.start(m, p);
  std::vector<PlanFollower::Due> d;
  f.prefetches_due(0, &d);
  std::sort(d.begin(), d.end(), [](const auto& a, const auto& b) { return a.block < b.block; });
  ASSERT_EQ(std::vector<uint64_t>({2, 4}), blocks(d)) << "block 6 has no use: it never moves";
  EXPECT_EQ(1u, d[0].next_use);
  EXPECT_EQ(3u, d[1].next_use);
  d.clear();
  f.evictions_due(0, &d);
  EXPECT_EQ(std::vector<uint64_t>({2}), blocks(d)) << "off the device until its prefetch";
  d.clear();
  f.evictions_due(8, &d);
  EXPECT_EQ(std::vector<uint64_t>({2}), blocks(d)) << "and again after its last use";
  d.clear();
  f.prefetches_due(9, &d);
  EXPECT_TRUE(d.empty()) << "its next prefetch is the next step's";
}

// A plan's names are those of the step it was learned from; a block made in
// the current step stands for the name its first use had there, even when
// the steps' launch numbers differ (a first step with more launches), and a
// block live across steps for its own id.
TEST(ScheduleChooser, APlansNamesFindTheBlocksOfTheStepItIsCarriedOutIn) {
  ScheduleChooser c;
  uint64_t seq = 0;
  auto launch = [&](std::initializer_list<uint64_t> ids) {
    ++seq;
    for (uint64_t b : ids) c.on_access({b, kMiB, 1, seq, "k"});
  };
  constexpr uint64_t W = 0x10000, A0 = 0x20000, A1 = 0x40000;
  c.on_alloc(W);
  launch({});  // step 0 has two launches more than step 1
  launch({});
  launch({W});  // 2 (from 0)
  c.on_alloc(A0);
  launch({A0});  // 3: A0's first use
  launch({W, A0});
  c.on_free(A0);
  c.on_step(seq);
  const StepModel m = c.learned_step(2 * kMiB);
  ASSERT_EQ(5u, m.launch_ns.size());
  uint64_t a_name = 0;
  for (const auto& b : m.blocks)
    if (!b.carried) a_name = b.id;
  ASSERT_NE(0u, a_name);
  EXPECT_EQ(W, c.live_block(W));

  launch({W});  // 0, aligned with launch 2 of step 0 by W's first use
  EXPECT_EQ(2u, c.model_index(seq));
  EXPECT_EQ(0u, c.step_index(seq));
  EXPECT_EQ(0u, c.live_block(a_name)) << "A1 has not had its first use yet";
  c.on_alloc(A1);
  launch({A1});  // 1: its first use, at A0's place in step 0
  EXPECT_EQ(3u, c.model_index(seq));
  EXPECT_EQ(A1, c.live_block(a_name));
  EXPECT_EQ(a_name, c.model_id(A1));
  EXPECT_EQ(W, c.model_id(W));
  c.on_free(A1);
  EXPECT_EQ(0u, c.live_block(a_name)) << "freed";
  c.on_free(W);
  EXPECT_EQ(0u, c.live_block(W));
}

// Whether the step being run is the plan's: its allocations by each launch
// against the model's, within an eighth or the slack given; carried blocks
// do not count (they are not allocated in the step).
TEST(PlanFollower, AStepThatAllocatesOtherwiseIsNoticed) {
  StepModel m;
  m.launch_ns.assign(10, 1000);
  StepModel::Block a;
  a.id = 1;
  a.bytes = 64 * kMiB;
  a.alloc = 2;
  a.free = 6;
  a.uses = {2, 5};
  StepModel::Block b = a;
  b.id = 2;
  b.alloc = 4;
  m.blocks = {a, b, carried(3, {1, 8})};
  Plan p;
  p.moves = {{1, 2, 4, 5}};
  PlanFollower f;
  EXPECT_TRUE(f.allocations_match(0, 1 << 30, 0)) << "no plan: nothing to judge";
  f.start(m, p);
  const uint64_t slack = 4 * kMiB;
  EXPECT_TRUE(f.allocations_match(1, 0, slack));
  EXPECT_TRUE(f.allocations_match(2, 64 * kMiB, slack));
  EXPECT_TRUE(f.allocations_match(3, 70 * kMiB, slack)) << "within an eighth";
  EXPECT_FALSE(f.allocations_match(3, 80 * kMiB, slack));
  EXPECT_TRUE(f.allocations_match(2, 32 * kMiB, slack)) << "midway through launch 2's";
  EXPECT_FALSE(f.allocations_match(5, 32 * kMiB, slack)) << "short of launch 2's";
  EXPECT_TRUE(f.allocations_match(4, 128 * kMiB, slack));
  EXPECT_TRUE(f.allocations_match(50, 128 * kMiB, slack)) << "past the model's end: its total";
  EXPECT_FALSE(f.allocations_match(1, 8 * kMiB, slack)) << "more than the slack before any";
  EXPECT_TRUE(f.allocations_match(1, 3 * kMiB, slack));
  f.stop();
  EXPECT_TRUE(f.allocations_match(3, 1 << 30, slack));
}

// A plan with no move still brings back the carried blocks the last step
// left on the host (a step that fits): it is carried out, and judged.
TEST(PlanFollower, APlanOfCarriedPrefetchesAloneIsCarriedOut) {
  StepModel m;
  m.launch_ns.assign(10, 1000);
  m.blocks = {carried(3, {4, 8})};
  PlanFollower f;
  f.start(m, Plan{});
  EXPECT_TRUE(f.active());
  std::vector<PlanFollower::Due> d;
  f.prefetches_due(0, &d);
  EXPECT_EQ(std::vector<uint64_t>{3}, blocks(d));
  EXPECT_FALSE(f.allocations_match(1, 64 * kMiB, 4 * kMiB));
}
