// policy::ScheduleChooser: the learned step schedule (policy/schedule.h),
// fed events as the allocator feeds them, without CUDA.
#include <gtest/gtest.h>

#include <initializer_list>
#include <vector>

#include "schedule.h"

using spillway::policy::Candidate;
using spillway::policy::ScheduleChooser;
using spillway::policy::Use;

namespace {

constexpr size_t kMiB = 1 << 20;

// The block a learned step's model names `id`, or null.
const spillway::policy::StepModel::Block* block_named(const spillway::policy::StepModel& m,
                                                      uint64_t id) {
  for (const auto& b : m.blocks)
    if (b.id == id) return &b;
  return nullptr;
}

// Feeds launches in order: each touches the listed blocks.
class Feeder {
 public:
  explicit Feeder(ScheduleChooser& c) : c_(c) {}
  void launch(std::initializer_list<uint64_t> blocks) {
    ++seq_;
    for (uint64_t b : blocks) c_.on_access({b, kMiB, 1, seq_, "k"});
  }
  // spillway_mark_step after the launches so far.
  void step() { c_.on_step(seq_); }

 private:
  ScheduleChooser& c_;
  uint64_t seq_ = 0;
};

std::vector<Candidate> candidates(std::initializer_list<uint64_t> ids) {
  std::vector<Candidate> c;
  uint64_t tick = 0;
  for (uint64_t id : ids) c.push_back({id, kMiB, ++tick});  // in the order given: oldest first
  return c;
}

}  // namespace

// Before a step has ended there is nothing to predict from: among blocks
// used within the last kFirstStepGuard launches, least recently used first.
TEST(ScheduleChooser, BeforeAStepEndsItChoosesLeastRecentlyUsed) {
  ScheduleChooser c;
  Feeder f(c);
  for (uint64_t id : {1, 2, 3}) c.on_alloc(id);
  f.launch({1});
  f.launch({2});
  f.launch({3});
  EXPECT_FALSE(c.learned());
  EXPECT_EQ(ScheduleChooser::kUnknown, c.next_use(1));
  EXPECT_EQ(std::vector<uint64_t>({1}), c.choose(candidates({1, 2, 3}), kMiB));
}

// Before a step has ended, blocks idle longer than kFirstStepGuard launches
// go before the others, the most recently used of them first: an optimizer
// loop's parameters just updated, not those it reads next (used longest
// ago). The others follow, least recently used first.
TEST(ScheduleChooser, BeforeAStepEndsTheBlocksIdleAWhileGoNewestFirst) {
  ScheduleChooser c;
  Feeder f(c);
  for (uint64_t id : {1, 2, 3, 4, 5}) c.on_alloc(id);
  f.launch({1});
  f.launch({2});
  f.launch({3});
  for (uint64_t i = 0; i < ScheduleChooser::kFirstStepGuard; ++i) f.launch({4});
  f.launch({5});
  // Idle: 1 for 67 launches, 2 for 66, 3 for 65; 4 for 1, 5 for 0.
  EXPECT_FALSE(c.learned());
  EXPECT_EQ(std::vector<uint64_t>({3}), c.choose(candidates({1, 2, 3, 4, 5}), kMiB));
  EXPECT_EQ(std::vector<uint64_t>({3, 2, 1}), c.choose(candidates({1, 2, 3, 4, 5}), 3 * kMiB));
  EXPECT_EQ(std::vector<uint64_t>({3, 2, 1, 4}), c.choose(candidates({1, 2, 3, 4, 5}), 4 * kMiB));
  // A block this chooser never saw used counts as idle since ever: among
  // the idle ones, after every block it saw.
  EXPECT_EQ(std::vector<uint64_t>({3, 2, 1, 9}),
            c.choose(candidates({9, 1, 2, 3, 4, 5}), 4 * kMiB));
}

// Step 0 uses A B C A B; in step 1 (new blocks, new ids, same allocation
// order), after A B C, A is needed before B: Belady evicts B, where least
// recent use would evict A.
TEST(ScheduleChooser, EvictsTheBlockUsedFurthestAheadInTheLearnedStep) {
  ScheduleChooser c;
  Feeder f(c);
  for (uint64_t id : {10, 20, 30}) c.on_alloc(id);
  f.launch({10});
  f.launch({20});
  f.launch({30});
  f.launch({10});
  f.launch({20});
  for (uint64_t id : {10, 20, 30}) c.on_free(id);
  f.step();
  ASSERT_TRUE(c.learned());
  for (uint64_t id : {11, 21, 31}) c.on_alloc(id);
  f.launch({11});
  f.launch({21});
  f.launch({31});
  EXPECT_EQ(1u, c.next_use(11));
  EXPECT_EQ(2u, c.next_use(21));
  EXPECT_EQ(ScheduleChooser::kNever, c.next_use(31)) << "C is not used again in the step";
  EXPECT_EQ(std::vector<uint64_t>({21}), c.choose(candidates({11, 21}), kMiB));
  EXPECT_EQ(std::vector<uint64_t>({31, 21}), c.choose(candidates({11, 21, 31}), 2 * kMiB));
  // Once A has been used again, it is not used any more in the step.
  f.launch({11});
  EXPECT_EQ(ScheduleChooser::kNever, c.next_use(11));
}

// Weights are made once, in step 0, and live on: in step 1 they are known by
// their own ids, and the activations made in step 1 line up with those of
// step 0 although step 0 also made the weights.
TEST(ScheduleChooser, BlocksLivingAcrossStepsAreThemselvesAndTheOthersLineUp) {
  ScheduleChooser c;
  Feeder f(c);
  c.on_alloc(100);  // a weight
  c.on_alloc(1);    // activation 0
  c.on_alloc(2);    // activation 1
  f.launch({100, 1});
  f.launch({2});
  f.launch({1});
  f.launch({100, 2});
  c.on_free(1);
  c.on_free(2);
  f.step();
  c.on_alloc(3);  // activation 0 of step 1
  c.on_alloc(4);  // activation 1
  f.launch({100, 3});
  EXPECT_EQ(2u, c.next_use(3)) << "as activation 0: used again 2 launches later";
  EXPECT_EQ(3u, c.next_use(100)) << "the weight: at the step's 4th launch";
  EXPECT_EQ(ScheduleChooser::kUnknown, c.next_use(4)) << "not used yet: no name yet";
  f.launch({4});
  EXPECT_EQ(2u, c.next_use(4)) << "as activation 1: next used 2 launches later";
  f.launch({3});
  f.launch({100, 4});
  // Past its last use in the step, a block that lives across steps comes
  // back at its first use in the next step; a step's own block never does.
  EXPECT_EQ(1u, c.next_use(100));
  EXPECT_EQ(ScheduleChooser::kNever, c.next_use(3));
}

// A block with no match (the step made more blocks than the last one) has
// no prediction: it ranks by how long it has gone unused, among the others.
TEST(ScheduleChooser, ABlockWithoutAMatchRanksByHowLongItHasGoneUnused) {
  ScheduleChooser c;
  Feeder f(c);
  c.on_alloc(1);
  f.launch({1});
  f.launch({1});
  c.on_free(1);
  f.step();
  c.on_alloc(2);   // matches 1
  c.on_alloc(99);  // no match: the second block of the step's 2nd launch
  f.launch({2});
  f.launch({2, 99});
  for (int i = 0; i < 5; ++i) f.launch({});
  f.launch({2});
  EXPECT_EQ(ScheduleChooser::kUnknown, c.next_use(99));
  // Its predecessor's uses (launches 1 and 2) are all behind.
  EXPECT_EQ(ScheduleChooser::kNever, c.next_use(2));
  EXPECT_EQ(std::vector<uint64_t>({2}), c.choose(candidates({99, 2}), kMiB));
  EXPECT_EQ(std::vector<uint64_t>({2, 99}), c.choose(candidates({99, 2}), 2 * kMiB));
}

// A longer sequence makes more tensors large enough to be spillway's: the
// step has a block the last one did not, first used before the others. The
// others still find their predecessors (matching by allocation order would
// shift them all by one).
TEST(ScheduleChooser, ANewBlockEarlierInTheStepDoesNotShiftTheOthers) {
  ScheduleChooser c;
  Feeder f(c);
  c.on_alloc(1);  // A
  c.on_alloc(2);  // B
  f.launch({});
  f.launch({1});
  f.launch({2});
  f.launch({2});
  f.launch({1});
  c.on_free(1);
  c.on_free(2);
  f.step();
  c.on_alloc(30);  // new this step
  c.on_alloc(10);  // A'
  c.on_alloc(20);  // B'
  f.launch({30});
  f.launch({10});
  f.launch({20});
  EXPECT_EQ(2u, c.next_use(10));
  EXPECT_EQ(1u, c.next_use(20));
  EXPECT_EQ(ScheduleChooser::kUnknown, c.next_use(30));
  EXPECT_EQ(std::vector<uint64_t>({10}), c.choose(candidates({10, 20}), kMiB));
}

// A freed id reused for a new allocation is a new block, named anew by its
// first use.
TEST(ScheduleChooser, AReusedIdIsANewBlock) {
  ScheduleChooser c;
  Feeder f(c);
  c.on_alloc(7);
  c.on_alloc(8);
  f.launch({7});
  f.launch({8});
  f.launch({8});
  f.launch({7});
  c.on_free(7);
  c.on_free(8);
  f.step();
  c.on_alloc(8);
  c.on_alloc(7);
  f.launch({8});  // used where 7 was first used: 7's successor
  EXPECT_EQ(3u, c.next_use(8));
  EXPECT_EQ(ScheduleChooser::kUnknown, c.next_use(7)) << "a new block, not yet used";
  f.launch({7});
  EXPECT_EQ(1u, c.next_use(7));
}

// A step too big to record (or a job that never marks a step) is not
// learned: the record stops at its cap, victims go by least recent use, and
// the next step is recorded again.
TEST(ScheduleChooser, AStepTooBigToRecordIsNotLearned) {
  const size_t cap = 3 * ScheduleChooser::kKeyUnits;
  ScheduleChooser c(cap);
  Feeder f(c);
  c.on_alloc(1);
  c.on_alloc(2);
  f.launch({1});
  EXPECT_EQ(1 + ScheduleChooser::kKeyUnits, c.recorded()) << "a use and a new block";
  for (size_t i = 0; c.recorded() + 1 <= cap && i < cap; ++i) f.launch({1});
  EXPECT_EQ(cap, c.recorded());
  f.launch({2});
  EXPECT_EQ(0u, c.recorded()) << "stopped recording";
  f.step();
  EXPECT_FALSE(c.learned());
  EXPECT_EQ(std::vector<uint64_t>({1}), c.choose(candidates({1, 2}), kMiB)) << "LRU";
  f.launch({1});
  EXPECT_EQ(1 + ScheduleChooser::kKeyUnits, c.recorded()) << "recorded again, 1 by its id now";
  f.step();
  EXPECT_TRUE(c.learned());
}

// The step ends where spillway_mark_step says, not at the last launch that
// touched a large block: launches after it (small tensors only) count in
// the step, and the next step's launch numbers start after them.
TEST(ScheduleChooser, AStepEndsWhereItIsMarked) {
  ScheduleChooser c;
  Feeder f(c);
  c.on_alloc(1);
  f.launch({1});
  f.launch({});
  f.launch({1});
  f.launch({});  // small tensors only, still this step
  c.on_free(1);
  f.step();
  c.on_alloc(2);
  f.launch({2});  // launch 1 of the step, as 1's first use was
  EXPECT_EQ(2u, c.next_use(2));
}

// A block that outlives its step (kept past the mark) is known by its id
// from then on, and the next step's block made at the same point still
// finds it as its predecessor.
TEST(ScheduleChooser, ABlockOutlivingItsStepStillNamesItsSuccessor) {
  ScheduleChooser c;
  Feeder f(c);
  c.on_alloc(1);
  f.launch({1});
  f.launch({});
  f.launch({1});
  f.step();  // 1 still live
  c.on_free(1);
  c.on_alloc(2);
  f.launch({2});
  EXPECT_EQ(2u, c.next_use(2));
}

// A carried block freed during a step leaves no record: a new block at the
// same address that lives on is predicted from its own uses.
TEST(ScheduleChooser, ABlockAtTheAddressOfAFreedCarriedOneHasItsOwnRecord) {
  ScheduleChooser c;
  Feeder f(c);
  c.on_alloc(5);
  f.launch({5});
  f.step();       // 5 carried
  f.launch({5});  // launch 1
  c.on_free(5);
  c.on_alloc(5);  // a new block at the same address
  f.launch({});
  f.launch({5});  // launch 3: its first use
  f.step();       // the new 5 carried, with its use at 3
  EXPECT_EQ(3u, c.next_use(5)) << "its own use at launch 3, not the freed block's at 1";
}

// The step just ended, as the planner's model (planner.h): every block once,
// with its live range and uses by launch index from 0, sizes rounded to the
// granule; launches that touch no large block still count.
TEST(ScheduleChooser, TheLearnedStepIsThePlannersModel) {
  using spillway::policy::StepModel;
  constexpr uint64_t W = 0x10000, A = 0x20000, T = 0x30000;  // addresses: even
  ScheduleChooser c;
  Feeder f(c);
  EXPECT_TRUE(c.learned_step(2 * kMiB).launch_ns.empty());  // nothing learned yet
  EXPECT_EQ(0u, c.learned_launches());
  c.on_alloc(W);  // a weight, made before any step
  f.launch({W});
  f.step();
  c.on_alloc(A);     // an activation, made before the step's first launch
  f.launch({W});     // 0
  f.launch({});      // 1: no large block
  f.launch({A});     // 2
  c.on_alloc(T);     // a temporary, after launch 2
  f.launch({T});     // 3
  c.on_free(T);      // after launch 3
  f.launch({A, W});  // 4
  f.step();          // A stays live: it is carried into the next step
  const StepModel m = c.learned_step(2 * kMiB);
  ASSERT_EQ(5u, m.launch_ns.size());
  EXPECT_EQ(5u, c.learned_launches());
  ASSERT_EQ(3u, m.blocks.size());
  const StepModel::Block* w = block_named(m, W);
  ASSERT_NE(nullptr, w);
  EXPECT_TRUE(w->carried);
  EXPECT_EQ(0u, w->alloc);
  EXPECT_EQ(StepModel::kLive, w->free);
  EXPECT_EQ(std::vector<uint32_t>({0, 4}), w->uses);
  EXPECT_EQ(2 * kMiB, w->bytes);                  // 1 MiB used, a 2 MiB granule
  const StepModel::Block* a = block_named(m, A);  // live at the step's end: by its id
  ASSERT_NE(nullptr, a);
  EXPECT_FALSE(a->carried);  // made in the step
  EXPECT_EQ(0u, a->alloc);
  EXPECT_EQ(StepModel::kLive, a->free);
  EXPECT_EQ(std::vector<uint32_t>({2, 4}), a->uses);
  const StepModel::Block* t = nullptr;  // made and freed in the step: by its first use
  for (const auto& b : m.blocks)
    if (b.id != W && b.id != A) t = &b;
  ASSERT_NE(nullptr, t);
  EXPECT_EQ(1u, t->id % 2);
  EXPECT_EQ(3u, t->alloc);
  EXPECT_EQ(4u, t->free);
  EXPECT_EQ(std::vector<uint32_t>({3}), t->uses);
  EXPECT_EQ(W, c.model_id(W));
  EXPECT_EQ(A, c.model_id(A));

  // The planner takes it as it is: with durations and a budget that cannot
  // hold W and A together at launch 2, one of them leaves between uses.
  StepModel timed = m;
  timed.launch_ns.assign(5, 1'000'000);  // 1 ms each
  spillway::policy::PlanOptions o;
  o.budget = 5 * kMiB;  // W, A and T need 6 MiB at launch 3
  const spillway::policy::Plan p = spillway::policy::plan_step(timed, o);
  EXPECT_TRUE(p.fits);
  EXPECT_FALSE(p.moves.empty());
}

// The first step has launches the next ones do not (PyTorch's optimizer
// creates its state then): its launch numbers are shifted against theirs.
// The uses of blocks live across steps align them, for the predictions and
// for the blocks named ahead of their use. Step 0: five launches of a
// temporary T, then X at 6, Y at 10, X at 12. Step 1: X at 1, Y at 5, X at 7.
TEST(ScheduleChooser, StepsOfDifferentLengthsAreAlignedByTheBlocksTheyShare) {
  ScheduleChooser c;
  Feeder f(c);
  const uint64_t x = 1, y = 2, t = 3;
  c.on_alloc(x);
  c.on_alloc(y);
  c.on_alloc(t);
  for (int i = 0; i < 5; ++i) f.launch({t});
  c.on_free(t);
  f.launch({x});
  for (int i = 7; i < 10; ++i) f.launch({});
  f.launch({y});
  f.launch({});
  f.launch({x});
  f.step();
  f.launch({x});                 // its first use, launch 6 of step 0: step 1 runs 5 launches early
  EXPECT_EQ(4u, c.next_use(y));  // launch 10 of step 0
  EXPECT_EQ(6u, c.next_use(x));  // launch 12 of step 0
  std::vector<uint64_t> named;
  c.upcoming(4, &named);
  EXPECT_EQ(std::vector<uint64_t>({y}), named) << "Y is used 4 launches from now";
  named.clear();
  c.upcoming(4, &named);
  EXPECT_TRUE(named.empty()) << "a block is named once as the window reaches its use";
  // Only a block used further ahead than the one a prefetch is for may go.
  EXPECT_EQ(std::vector<uint64_t>({x}), c.choose_beyond(candidates({x, y}), kMiB, 4));
  EXPECT_TRUE(c.choose_beyond(candidates({x, y}), kMiB, 6).empty());
}

// The optimizer's first step fills its state with zeros: launches that make
// a block which stays, touching only a weight besides. The next step has no
// such launch, so the learned step leaves them out and takes the state as
// live from the step's start (left in, the weights' uses there would line
// up the next step's updates with the fills). Launches that also touch what
// the step made are kept: an input's copy (no weight), a layer reading the
// input, a loss that reads the output (both live at the step's end too).
// Step 0 (after the weights' own step): input X, forward W1 and W2 (output
// O), loss L, backward gradient G (made, freed), zero fills S1 from W1 and
// S2 from W2, updates W1+G+S1 and W2+G+S2.
TEST(ScheduleChooser, AFirstStepsLaunchesThatOnlyMadeLastingStateAreLeftOut) {
  using spillway::policy::StepModel;
  constexpr uint64_t W1 = 0x10000, W2 = 0x20000, X = 0x30000, O = 0x40000, L = 0x50000, G = 0x60000,
                     S1 = 0x70000, S2 = 0x80000;
  ScheduleChooser c;
  Feeder f(c);
  c.on_alloc(W1);
  c.on_alloc(W2);
  f.launch({W1, W2});
  f.step();
  EXPECT_TRUE(c.dropped_launches().empty());  // W1 and W2: no weight besides
  c.on_alloc(X);
  f.launch({X});  // 1: the input's copy
  c.on_alloc(O);
  f.launch({W1, X, O});  // 2
  f.launch({W2, O});     // 3
  c.on_alloc(L);
  f.launch({O, L});  // 4: the loss, live at the end too, but it reads O
  c.on_alloc(G);
  f.launch({G, W1});  // 5
  c.on_alloc(S1);
  f.launch({S1, W1});  // 6: left out
  c.on_alloc(S2);
  f.launch({S2, W2});     // 7: left out
  f.launch({W1, G, S1});  // 8
  f.launch({W2, G, S2});  // 9
  c.on_free(G);
  f.step();
  EXPECT_EQ(std::vector<uint32_t>({5, 6}), c.dropped_launches());  // from 0
  ASSERT_EQ(7u, c.learned_launches());
  const StepModel m = c.learned_step(0);
  ASSERT_EQ(7u, m.launch_ns.size());
  for (uint64_t s : {S1, S2}) {
    const StepModel::Block* b = block_named(m, s);
    ASSERT_NE(nullptr, b);
    EXPECT_TRUE(b->carried);
    EXPECT_EQ(0u, b->alloc);
  }
  EXPECT_EQ(std::vector<uint32_t>({5}), block_named(m, S1)->uses);  // the update, renumbered
  EXPECT_EQ(std::vector<uint32_t>({6}), block_named(m, S2)->uses);
  EXPECT_EQ(std::vector<uint32_t>({1, 4, 5}), block_named(m, W1)->uses);
  EXPECT_EQ(std::vector<uint32_t>({2, 6}), block_named(m, W2)->uses);
  for (uint64_t made : {X, O, L}) {
    const StepModel::Block* b = block_named(m, made);
    ASSERT_NE(nullptr, b);
    EXPECT_FALSE(b->carried) << "made each step";
  }
  EXPECT_EQ(3u, block_named(m, L)->alloc);
  EXPECT_EQ(std::vector<uint32_t>({3}), block_named(m, L)->uses);

  // The next step has no fill: nothing is left out of it.
  f.launch({W1});
  f.step();
  EXPECT_TRUE(c.dropped_launches().empty());
  EXPECT_EQ(1u, c.learned_launches());
}

// Two state tensors in one block (the second allocation split off the first
// one's cached block): the second fill's use of the block is not its first,
// yet it goes with the first fill, left out. The update that reads the
// gradient too stays. Step 0 (after the weights' own step): backward makes G,
// fills of S1 and S2 (both in block B) from W, the update W+G+B.
TEST(ScheduleChooser, FillsOfStateSharingABlockAreLeftOutTogether) {
  constexpr uint64_t W = 0x10000, G = 0x20000, B = 0x30000, A = 0x40000;
  ScheduleChooser c;
  Feeder f(c);
  c.on_alloc(W);
  f.launch({W});
  f.step();
  c.on_alloc(A);
  f.launch({W, A});  // 1: forward
  c.on_alloc(G);
  f.launch({G, A});  // 2: backward
  c.on_free(A);
  c.on_alloc(B);
  f.launch({B, W});     // 3: S1's fill
  f.launch({B, W});     // 4: S2's, in the rest of B
  f.launch({W, G, B});  // 5: the update
  f.step();
  EXPECT_EQ(std::vector<uint32_t>({2, 3}), c.dropped_launches());  // from 0
  EXPECT_EQ(3u, c.learned_launches());
  const spillway::policy::StepModel m = c.learned_step(0);
  ASSERT_NE(nullptr, block_named(m, B));
  EXPECT_TRUE(block_named(m, B)->carried);
  EXPECT_EQ(std::vector<uint32_t>({2}), block_named(m, B)->uses);
}

// The same as a job marks it: its first mark comes after its first step(),
// so the weights are made in the step too (allocated, and filled by kernels
// of their own here). They are told by coming before the step's first
// launch that uses a block an earlier launch used (the forward's first read
// of a weight): they count as live from before the step, and the zero fills
// that read them are left out as above. The output and the loss come after.
// The input's copy comes before that launch too: it is taken as set-up,
// which only makes the first model carry a block the next step replaces.
// Set-up: W1 and W2 filled; then input X (its copy), forward through A to
// output O, loss L, backward G, fills S1 and S2, updates.
TEST(ScheduleChooser, AJobsFirstStepTellsTheSetUpsWeightsFromWhatTheStepMakes) {
  using spillway::policy::StepModel;
  constexpr uint64_t W1 = 0x10000, W2 = 0x20000, X = 0x30000, O = 0x40000, L = 0x50000, G = 0x60000,
                     S1 = 0x70000, S2 = 0x80000, A = 0x90000;
  ScheduleChooser c;
  Feeder f(c);
  c.on_alloc(W1);
  f.launch({W1});  // 1: W1's fill
  c.on_alloc(W2);
  f.launch({W2});  // 2
  c.on_alloc(X);
  f.launch({X});  // 3: the input's copy
  c.on_alloc(A);
  f.launch({W1, X, A});  // 4: the first to use what an earlier launch used
  c.on_alloc(O);
  f.launch({W2, A, O});  // 5
  c.on_alloc(L);
  f.launch({O, L});  // 6
  c.on_alloc(G);
  f.launch({G, W1, A});  // 7
  c.on_free(A);
  c.on_alloc(S1);
  f.launch({S1, W1});  // 8: left out
  c.on_alloc(S2);
  f.launch({S2, W2});     // 9: left out
  f.launch({W1, G, S1});  // 10
  f.launch({W2, G, S2});  // 11
  c.on_free(G);
  f.step();
  EXPECT_EQ(std::vector<uint32_t>({7, 8}), c.dropped_launches());  // from 0
  ASSERT_EQ(9u, c.learned_launches());
  const StepModel m = c.learned_step(0);
  for (uint64_t lasting : {W1, W2, S1, S2}) {
    const StepModel::Block* b = block_named(m, lasting);
    ASSERT_NE(nullptr, b);
    EXPECT_TRUE(b->carried) << "live from before the next step";
    EXPECT_EQ(0u, b->alloc);
  }
  EXPECT_EQ(std::vector<uint32_t>({0, 3, 6, 7}), block_named(m, W1)->uses);
  EXPECT_EQ(std::vector<uint32_t>({7}), block_named(m, S1)->uses);
  for (uint64_t made : {O, L}) {
    const StepModel::Block* b = block_named(m, made);
    ASSERT_NE(nullptr, b);
    EXPECT_FALSE(b->carried) << "made each step";
  }
  EXPECT_EQ(5u, block_named(m, L)->alloc);

  // The second step has live blocks at its start: its own weights-to-be (a
  // block made before its first reuse, still live) are what it made.
  f.launch({W1});
  c.on_alloc(X + 1);
  f.launch({X + 1});
  f.launch({W1, X + 1});
  f.step();
  const StepModel next = c.learned_step(0);
  ASSERT_NE(nullptr, block_named(next, X + 1));
  EXPECT_FALSE(block_named(next, X + 1)->carried);
}

// Near a step's end the window reaches the next step: a block live across
// steps is named for its first use there.
TEST(ScheduleChooser, TheWindowReachesIntoTheNextStepForCarriedBlocks) {
  ScheduleChooser c;
  Feeder f(c);
  const uint64_t w = 1, a = 2;
  c.on_alloc(w);
  f.launch({w});  // 1
  c.on_alloc(a);
  f.launch({a});  // 2
  f.launch({});   // 3
  f.launch({a});  // 4
  f.step();
  f.launch({w});
  f.launch({w});
  std::vector<uint64_t> named;
  c.upcoming(3, &named);  // launches 3, 4 of this step and 1 of the next
  EXPECT_EQ(std::vector<uint64_t>({a, w}), named);
  EXPECT_EQ(3u, c.next_use(w));
  EXPECT_TRUE(c.choose_beyond(candidates({w}), kMiB, 3).empty());
}
