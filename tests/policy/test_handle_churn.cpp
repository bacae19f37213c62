// policy::handle_churn (policy/handle_churn.h): the VMM calls a plan costs
// when device memory comes as handles of exact sizes, on steps small enough
// to work out by hand; and predict's use of the time they take
// (StepModel::host_extra_ns, fetch_extra_ns).
#include <gtest/gtest.h>

#include <initializer_list>
#include <vector>

#include "handle_churn.h"
#include "planner.h"
#include "step_builders.h"

using spillway::policy::handle_churn;
using spillway::policy::HandleChurn;
using spillway::policy::Move;
using spillway::policy::Plan;
using spillway::policy::PlanOptions;
using spillway::policy::predict;
using spillway::policy::StepModel;
using spillway::policy::VmmCallCosts;

using namespace step_builders;

namespace {

StepModel launches(size_t n) {
  StepModel m;
  m.launch_ns.assign(n, 100);
  return m;
}

// Each entry point its own power of ten, so a sum says which were made.
VmmCallCosts costs() {
  VmmCallCosts c;
  c.create_ns = 1;
  c.map_ns = 10;
  c.grant_ns = 100;
  c.unmap_ns = 1000;
  c.release_ns = 10000;
  return c;
}

// Ten launches of 100 ns, 100 ns apart on the host; A (100 bytes, used at
// launches 1 and 8) leaves after launch 1 and comes back at launch 7, to
// make room for B (launches 3-5) under a budget of 150 bytes.
StepModel a_leaves_for_b() {
  StepModel m;
  m.launch_ns.assign(10, 100);
  m.launch_host_ns = 100;
  m.blocks = {block(1, 100, 0, 10, {1, 8}), block(2, 100, 3, 6, {3, 4, 5})};
  return m;
}

Move a_leaves_between_its_uses() {
  return move(1, 1, 7, 8);
}

}  // namespace

// With room for every freed block, each step's allocations take the blocks
// the step before freed: no call at all once the first step made them.
TEST(HandleChurn, AFreedBlockServesTheNextAllocationOfItsSizeWithoutACall) {
  StepModel m = launches(3);
  m.blocks = {block(1, 4, 0, 1, {0}), block(2, 2, 1, 2, {1})};
  const HandleChurn c = handle_churn(m, {}, 6, costs());
  EXPECT_EQ(std::vector<uint64_t>(3, 0), c.job_ns);
  EXPECT_EQ(std::vector<uint64_t>(3, 0), c.mover_ns);
  EXPECT_EQ(0u, c.creates);
  EXPECT_EQ(2u, c.reused);
}

// The same step under a cap of 4 bytes: A (4 bytes) freed at launch 1 must
// go for B (2 bytes) to be made, and B's for the next step's A. Each
// allocation is a create, a map and a grant, and a release of the other's
// cached block (an unmap and a release), on the job's thread.
TEST(HandleChurn, UnderAFullCapEachSizeRemakesItsHandleEveryStep) {
  StepModel m = launches(3);
  m.blocks = {block(1, 4, 0, 1, {0}), block(2, 2, 1, 2, {1})};
  const HandleChurn c = handle_churn(m, {}, 4, costs());
  EXPECT_EQ((std::vector<uint64_t>{11111, 11111, 0}), c.job_ns);
  EXPECT_EQ(std::vector<uint64_t>(3, 0), c.mover_ns);
  EXPECT_EQ(2u, c.creates);
  EXPECT_EQ(2u, c.maps);
  EXPECT_EQ(2u, c.unmaps);
  EXPECT_EQ(2u, c.releases);
  EXPECT_EQ(0u, c.reused);
}

// C leaves after launch 0 and comes back at launch 2: its prefetch takes
// the handle its eviction pooled, the swap's map and grant being the move's
// own (PlanOptions::move_host_ns), so nothing is charged.
TEST(HandleChurn, APrefetchTakesTheHandleItsEvictionPooled) {
  StepModel m = launches(4);
  m.blocks = {carried(1, 4, {0, 3})};
  const HandleChurn c = handle_churn(m, {move(1, 0, 2, 3)}, 100, costs());
  EXPECT_EQ(std::vector<uint64_t>(4, 0), c.job_ns);
  EXPECT_EQ(std::vector<uint64_t>(4, 0), c.mover_ns);
  EXPECT_EQ(0u, c.creates);
  EXPECT_EQ(1u, c.reused);
}

// Under a cap of 4 bytes, D (2 bytes, launch 1) needs C's pooled handle
// released (job: create, map, grant, release), and C's prefetch at launch 2
// then creates its handle and releases D's cached block (mover: create,
// unmap, release).
TEST(HandleChurn, APrefetchWhoseHandleWasReleasedMakesOneOnTheMover) {
  StepModel m = launches(4);
  m.blocks = {carried(1, 4, {0, 3}), block(2, 2, 1, 2, {1})};
  const HandleChurn c = handle_churn(m, {move(1, 0, 2, 3)}, 4, costs());
  EXPECT_EQ((std::vector<uint64_t>{0, 10111, 0, 0}), c.job_ns);
  EXPECT_EQ((std::vector<uint64_t>{0, 0, 11001, 0}), c.mover_ns);
  EXPECT_EQ(2u, c.creates);
  EXPECT_EQ(1u, c.maps);
  EXPECT_EQ(1u, c.unmaps);
  EXPECT_EQ(2u, c.releases);
}

// Free handles go in the order their size is needed again, latest first.
// Cap 6. At launch 0, A (4 bytes) is made and the cached C (1 byte, needed
// at launch 2) goes rather than D's (2 bytes), which B takes at once. At
// launch 2, C is made and the cached A goes (needed at the next step's
// launch 0) rather than B's, which D takes at launch 3.
TEST(HandleChurn, TheSizeNeededLastIsReleasedFirst) {
  StepModel m = launches(4);
  m.blocks = {block(1, 4, 0, 1, {0}), block(2, 2, 0, 1, {0}), block(3, 1, 2, 3, {2}),
              block(4, 2, 3, 4, {3})};
  const HandleChurn c = handle_churn(m, {}, 6, costs());
  EXPECT_EQ((std::vector<uint64_t>{11111, 0, 11111, 0}), c.job_ns);
  EXPECT_EQ(2u, c.creates);
  EXPECT_EQ(2u, c.releases);
  EXPECT_EQ(2u, c.reused);
}

// The job's calls before a launch are host time: a host-bound step (100 ns
// a launch, 5 us of calls before launch 1) takes 5.3 us instead of the 3
// launches' 3 us of compute.
TEST(HandleChurn, HostTimeBeforeALaunchLengthensAHostBoundStep) {
  StepModel m;
  m.launch_ns.assign(3, 1000);
  m.launch_host_ns = 100;
  EXPECT_EQ(3000u, predict(m, options(100), {}).step_ns);
  m.host_extra_ns = {0, 5000, 0};
  EXPECT_EQ(5300u, predict(m, options(100), {}).step_ns);
}

// The mover's calls before a prefetch's copy (making its handle) delay the
// copy: A's copy back, issued at launch 7 (700 ns) and landing at 800 just
// in time for launch 8, starts 500 ns later and launch 8 waits for it.
TEST(HandleChurn, MoverTimeBeforeAPrefetchDelaysItsCopy) {
  StepModel m = a_leaves_for_b();
  const Move mv = a_leaves_between_its_uses();
  const Plan free_calls = predict(m, options(150), {mv});
  ASSERT_EQ(1u, free_calls.moves.size());
  EXPECT_EQ(0u, free_calls.stall_ns);
  m.fetch_extra_ns.assign(10, 0);
  m.fetch_extra_ns[7] = 500;
  const Plan paid = predict(m, options(150), {mv});
  EXPECT_EQ(500u, paid.stall_ns);
}

// The driver makes VMM calls one at a time: the job's 20 ns of calls before
// launch 3 (issued at 300) cannot run during A's swap (300..330, after its
// copy 200..300) and go after it, so launch 3 starts at 350, where it would
// have started at 330 (the calls done while it waited for A's memory), and
// the step takes 1080 ns, not 1060.
TEST(HandleChurn, TheJobsCallsWaitForTheMoversSwaps) {
  StepModel m = a_leaves_for_b();
  const Move mv = a_leaves_between_its_uses();
  PlanOptions o = options(150);
  o.move_host_ns = 30;
  EXPECT_EQ(1060u, predict(m, o, {mv}).step_ns);
  m.host_extra_ns.assign(10, 0);
  m.host_extra_ns[3] = 20;
  EXPECT_EQ(1080u, predict(m, o, {mv}).step_ns);
}
