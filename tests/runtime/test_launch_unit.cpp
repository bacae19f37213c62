// A launch's blocks are one unit on the path a preloaded job takes: the
// simulated CUPTI calls the runtime's tracker, the tracker hands the launch's
// ranges to the runtime in one call, and the runtime hands each allocator
// all of its ranges at once. So restoring one block of a launch never evicts
// another block of the same launch. The runtime is the process's one
// (Runtime::get), configured in main().
#include <cstring>
#include <vector>

#include "runtime.h"
#include "sim_test_util.h"

using spillway::Allocator;
using spillway::Runtime;
using namespace simtest;

namespace {

constexpr size_t MiB = 1ull << 20;
constexpr size_t kBlock = 4 * MiB;  // the budget (main) holds three

uint64_t pattern(uint64_t seed, size_t i) {
  return seed * 0x9E3779B97F4A7C15ull ^ (i * 31 + 7);
}

uint64_t g_bad = 0;

// pair(const uint64_t* a, const uint64_t* b): both hold their patterns.
void pair_fn(const void* params, size_t, const simcuda_launch_info*, void*) {
  const uint64_t* p[2];
  std::memcpy(p, params, sizeof p);
  for (size_t k = 0; k < 2; ++k)
    for (size_t i = 0; i < kBlock / 8; ++i) g_bad += p[k][i] != pattern(k + 1, i);
}

TEST(LaunchUnit, RestoringOneBlockOfALaunchNeverEvictsAnother) {
  init_primary();
  Allocator* a = Runtime::get().allocator(0);
  ASSERT_NE(nullptr, a);
  static const size_t sizes[] = {8, 8};
  simcuda_kernel_desc d{};
  d.name = "pair";
  d.fn = pair_fn;
  d.param_sizes = sizes;
  d.num_params = 2;
  d.duration_ns = 1000;
  CUfunction pair = nullptr;
  ASSERT_CU(simcuda_register_function(&d, &pair));

  // A and B hold patterns; C and D are pinned, so when A and B are evicted
  // and D takes one of their device handles, the budget has room for one
  // of A and B only.
  void* blocks[4];
  for (size_t k = 0; k < 3; ++k) {
    blocks[k] = a->malloc(kBlock, nullptr);
    ASSERT_NE(nullptr, blocks[k]);
  }
  for (uint64_t k = 0; k < 2; ++k) {
    std::vector<uint64_t> h(kBlock / 8);
    for (size_t i = 0; i < h.size(); ++i) h[i] = pattern(k + 1, i);
    ASSERT_CU(cuMemcpyHtoD_v2(reinterpret_cast<CUdeviceptr>(blocks[k]), h.data(), kBlock));
  }
  auto pin = [&](void* p) {
    const auto lo = reinterpret_cast<uintptr_t>(p);
    const spillway::Touch t{lo, lo + 1};
    Runtime::get().hold(&t, 1);
  };
  pin(blocks[2]);
  ASSERT_CU(a->evict(blocks[0]));
  ASSERT_CU(a->evict(blocks[1]));
  blocks[3] = a->malloc(kBlock, nullptr);
  ASSERT_NE(nullptr, blocks[3]);
  pin(blocks[3]);

  void* params[] = {&blocks[0], &blocks[1]};
  ASSERT_CU(cuLaunchKernel(pair, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
  ASSERT_CU(cuCtxSynchronize());

  EXPECT_EQ(0u, g_bad) << "a block of the launch lost its bytes";
  // Range by range, A was restored first, then B's restore evicted A (the
  // only block not pinned) for its own room: two restores. As one unit, A
  // stays held while B is restored, and B, with no room left, is read where
  // it is, over the link: one restore. (What A does after the launch is the
  // background mover's business: not asserted.)
  EXPECT_EQ(1u, Runtime::get().stats().blocks_restored);
  EXPECT_EQ(Allocator::Residency::kHost, a->residency(blocks[1]));
}

}  // namespace

int main(int argc, char** argv) {
  setenv("SPILLWAY_GPU_BUDGET", "12MiB", 1);
  setenv("SPILLWAY_CUPTI_PATH", SIM_CUPTI_PATH, 1);
  setenv("SPILLWAY_POLICY", "lru", 1);
  setenv("SPILLWAY_LOG_LEVEL", "off", 1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
