// Access tracking: every way a kernel, copy or set can name an evicted block
// gets it restored before the work runs; uses on other streams are recorded
// without any record_stream. Each kernel checks a pattern, so stale bytes or
// a read over the link (an unrestored block) are caught.
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "allocator.h"
#include "cupti_api.h"
#include "driver.h"
#include "sim_test_util.h"
#include "tracker.h"

using spillway::Allocator;
using spillway::AllocatorOptions;
using spillway::Tracker;
using namespace simtest;

namespace {

constexpr size_t MiB = 1ull << 20;

uint64_t pattern(uint64_t seed, size_t i) {
  return seed * 0x9E3779B97F4A7C15ull ^ (i * 31 + 7);
}

std::atomic<uint64_t> g_bad{0};

// check(ptr base, uint64 seed, uint64 bytes): reads from `base` wherever the
// pointer argument points inside the block (the offset is subtracted back).
struct CheckArgs {
  const uint64_t* p;
  uint64_t seed;
  uint64_t bytes;
  uint64_t offset;  // p - block start
};
void check_fn(const void* params, size_t, const simcuda_launch_info*, void*) {
  CheckArgs a;
  std::memcpy(&a, params, sizeof a);
  const uint64_t* base =
      reinterpret_cast<const uint64_t*>(reinterpret_cast<const char*>(a.p) - a.offset);
  for (size_t i = 0; i < a.bytes / 8; ++i) g_bad += base[i] != pattern(a.seed, i);
}

// A by-value struct {int32 a; int32 b; const void* p; uint64 seed; uint64 bytes}.
struct ByValue {
  int32_t a, b;
  const uint64_t* p;
  uint64_t seed, bytes;
};
void struct_fn(const void* params, size_t, const simcuda_launch_info*, void*) {
  ByValue v;
  std::memcpy(&v, params, sizeof v);
  for (size_t i = 0; i < v.bytes / 8; ++i) g_bad += v.p[i] != pattern(v.seed, i);
}

void fill_host(std::vector<uint64_t>& h, uint64_t seed) {
  for (size_t i = 0; i < h.size(); ++i) h[i] = pattern(seed, i);
}

class TrackerTest : public ::testing::Test {
 protected:
  virtual void configure() {}
  void SetUp() override {
    configure();
    init_primary();
    std::string why;
    driver_ = spillway::cu::load(&why);
    ASSERT_NE(nullptr, driver_) << why;
    api_ = spillway::cupti::load(SIM_CUPTI_PATH, &why);
    ASSERT_NE(nullptr, api_) << why;
    AllocatorOptions o;
    alloc_ = Allocator::create(*driver_, o, &why);
    ASSERT_NE(nullptr, alloc_) << why;
    tracker_ = Tracker::start(*api_, *driver_, *alloc_, &why);
    ASSERT_NE(nullptr, tracker_) << why;
    static const size_t check_sizes[] = {8, 8, 8, 8};
    simcuda_kernel_desc d{};
    d.name = "check";
    d.fn = check_fn;
    d.param_sizes = check_sizes;
    d.num_params = 4;
    d.duration_ns = 1000;
    ASSERT_CU(simcuda_register_function(&d, &check_));
    ASSERT_CU(simcuda_register_kernel(&d, &check_kernel_));
    static const size_t struct_sizes[] = {sizeof(ByValue)};
    simcuda_kernel_desc s{};
    s.name = "by_value";
    s.fn = struct_fn;
    s.param_sizes = struct_sizes;
    s.num_params = 1;
    s.duration_ns = 1000;
    ASSERT_CU(simcuda_register_function(&s, &by_value_));
  }
  void TearDown() override {
    tracker_.reset();
    alloc_.reset();
  }

  // A 4 MiB block holding pattern(seed), then evicted.
  void* evicted_block(uint64_t seed, size_t bytes = 4 * MiB, CUstream s = nullptr) {
    void* p = alloc_->malloc(bytes, s);
    EXPECT_NE(nullptr, p);
    std::vector<uint64_t> h(bytes / 8);
    fill_host(h, seed);
    EXPECT_CU(cuMemcpyHtoD_v2(reinterpret_cast<CUdeviceptr>(p), h.data(), bytes));
    EXPECT_CU(alloc_->evict(p));
    EXPECT_EQ(Allocator::Residency::kHost, alloc_->residency(p));
    return p;
  }
  uint64_t remote_bytes() {
    simcuda_memory_stats ms;
    simcuda_get_memory_stats(0, &ms);
    return ms.remote_access_bytes;
  }
  void launch_check(void* block, size_t offset, uint64_t seed, size_t bytes, CUstream s) {
    CheckArgs a{reinterpret_cast<const uint64_t*>(static_cast<char*>(block) + offset), seed, bytes,
                offset};
    void* params[] = {&a.p, &a.seed, &a.bytes, &a.offset};
    ASSERT_CU(cuLaunchKernel(check_, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr));
  }

  const spillway::cu::Driver* driver_ = nullptr;
  const spillway::cupti::Api* api_ = nullptr;
  std::unique_ptr<Allocator> alloc_;
  std::unique_ptr<Tracker> tracker_;
  CUfunction check_ = nullptr, by_value_ = nullptr;
  CUkernel check_kernel_ = nullptr;
};

}  // namespace

TEST_F(TrackerTest, PointerAtStartInsideAndLastByteRestoresBeforeTheKernel) {
  const size_t bytes = 4 * MiB;
  int restores = 0;
  for (size_t offset : {size_t{0}, size_t{1000}, bytes - 1}) {
    void* p = evicted_block(100 + offset);
    const uint64_t remote = remote_bytes();
    launch_check(p, offset, 100 + offset, bytes, nullptr);
    ASSERT_CU(cuCtxSynchronize());
    EXPECT_EQ(Allocator::Residency::kDevice, alloc_->residency(p)) << offset;
    EXPECT_EQ(remote, remote_bytes()) << "the kernel read host memory: not restored in time";
    EXPECT_EQ(++restores, static_cast<int>(alloc_->stats().blocks_restored));
    alloc_->free(p, bytes, nullptr);
  }
  EXPECT_EQ(0u, g_bad.load());
  EXPECT_GE(tracker_->launches_seen(), 3u);
}

TEST_F(TrackerTest, PointerInsideAByValueStructRestores) {
  void* p = evicted_block(7);
  ByValue v{1, 2, static_cast<const uint64_t*>(p), 7, 4 * MiB};
  void* params[] = {&v};
  ASSERT_CU(cuLaunchKernel(by_value_, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(Allocator::Residency::kDevice, alloc_->residency(p));
  EXPECT_EQ(0u, g_bad.load());
}

TEST_F(TrackerTest, PointerInAnExtraBufferRestores) {
  void* p = evicted_block(8);
  CheckArgs a{static_cast<const uint64_t*>(p), 8, 4 * MiB, 0};
  size_t size = sizeof a;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &a, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  ASSERT_CU(cuLaunchKernel(check_, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, extra));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(Allocator::Residency::kDevice, alloc_->residency(p));
  EXPECT_EQ(0u, g_bad.load());
}

TEST_F(TrackerTest, LaunchThroughACUkernelHandleRestores) {
  void* p = evicted_block(9);
  CheckArgs a{static_cast<const uint64_t*>(p), 9, 4 * MiB, 0};
  void* params[] = {&a.p, &a.seed, &a.bytes, &a.offset};
  CUfunction as_function = reinterpret_cast<CUfunction>(check_kernel_);
  ASSERT_CU(cuLaunchKernel(as_function, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(Allocator::Residency::kDevice, alloc_->residency(p));
  EXPECT_EQ(0u, g_bad.load());
}

TEST_F(TrackerTest, CopyAndSetTouchingAnEvictedBlockRestoreIt) {
  const size_t bytes = 4 * MiB;
  void* src = evicted_block(10);
  std::vector<uint64_t> back(bytes / 8), want(bytes / 8);
  fill_host(want, 10);
  // A copy out of the middle of an evicted block.
  ASSERT_CU(cuMemcpyDtoH_v2(back.data(), reinterpret_cast<CUdeviceptr>(src), bytes));
  EXPECT_EQ(Allocator::Residency::kDevice, alloc_->residency(src));
  EXPECT_EQ(0, std::memcmp(back.data(), want.data(), bytes));
  // A memset into an evicted block.
  void* dst = evicted_block(11);
  ASSERT_CU(cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(dst) + 4096, 0xABCD, 16, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(Allocator::Residency::kDevice, alloc_->residency(dst));
  EXPECT_EQ(2u, alloc_->stats().blocks_restored);
}

TEST_F(TrackerTest, ASecondSubscriberLeavesUsBlind) {
  std::string why;
  auto second = Tracker::start(*api_, *driver_, *alloc_, &why);
  EXPECT_EQ(nullptr, second);
  EXPECT_NE(std::string::npos, why.find("another CUPTI client")) << why;
  // The first one still works.
  void* p = evicted_block(12);
  launch_check(p, 0, 12, 4 * MiB, nullptr);
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(Allocator::Residency::kDevice, alloc_->residency(p));
}

// Issue 3: a block used on another stream with no record_stream (and no
// note_use: the tracker sees the launch), freed and reused at once on its
// allocation stream, under jitter. Without tracking the reuse would
// overwrite the bytes the other stream is still reading.
class JitteredTrackerTest : public TrackerTest {
  void configure() override { setenv("SIMCUDA_JITTER", "31337", 1); }
};

TEST_F(JitteredTrackerTest, CrossStreamUseWithoutRecordStreamDoesNotCorrupt) {
  static const size_t sleep_sizes[] = {8};
  CUfunction sleeper = sleep_kernel(1000);
  (void)sleep_sizes;
  CUstream a, b;
  ASSERT_CU(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  CUevent ready;
  ASSERT_CU(cuEventCreate(&ready, CU_EVENT_DISABLE_TIMING));
  for (size_t bytes : {size_t{64 << 10}, size_t{3 * MiB}}) {
    for (int round = 0; round < 15; ++round) {
      const uint64_t seed = 5000u + static_cast<uint64_t>(round);
      void* p = alloc_->malloc(bytes, a);
      std::vector<uint64_t> h(bytes / 8);
      fill_host(h, seed);
      ASSERT_CU(cuMemcpyHtoDAsync_v2(reinterpret_cast<CUdeviceptr>(p), h.data(), bytes, a));
      ASSERT_CU(cuEventRecord(ready, a));
      ASSERT_CU(cuStreamWaitEvent(b, ready, 0));
      uint64_t us = 3000;
      void* sp[] = {&us};
      ASSERT_CU(cuLaunchKernel(sleeper, 1, 1, 1, 1, 1, 1, 0, b, sp, nullptr));
      launch_check(p, 0, seed, bytes, b);  // the use on b the tracker sees
      alloc_->free(p, bytes, a);           // no record_stream
      void* q = alloc_->malloc(bytes, a);
      std::vector<uint64_t> junk(bytes / 8, 0xDEADBEEF);
      ASSERT_CU(cuMemcpyHtoDAsync_v2(reinterpret_cast<CUdeviceptr>(q), junk.data(), bytes, a));
      ASSERT_CU(cuCtxSynchronize());
      alloc_->free(q, bytes, a);
    }
  }
  EXPECT_EQ(0u, g_bad.load());
  cuEventDestroy_v2(ready);
  cuStreamDestroy_v2(a);
  cuStreamDestroy_v2(b);
}

// Work captured into a graph reads its blocks whenever the graph is launched:
// they stay resident while the graph or an executable graph made from it
// exists, whatever the budget asks; once both are gone they can be evicted.
TEST_F(TrackerTest, CapturedBlocksStayResidentWhileTheGraphExists) {
  const size_t bytes = 4 * MiB;
  CUstream s;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  void* p = alloc_->malloc(bytes, s);
  std::vector<uint64_t> h(bytes / 8);
  fill_host(h, 21);
  ASSERT_CU(cuMemcpyHtoD_v2(reinterpret_cast<CUdeviceptr>(p), h.data(), bytes));
  ASSERT_CU(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  launch_check(p, 512, 21, bytes, s);  // an interior pointer, captured
  CUgraph graph = nullptr;
  ASSERT_CU(cuStreamEndCapture(s, &graph));
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiateWithFlags(&exec, graph, 0));
  EXPECT_EQ(0u, g_bad.load()) << "nothing runs during capture";
  // Evicting it is refused while the graph exists (a budget would skip it too).
  ASSERT_NE(CUDA_SUCCESS, alloc_->evict(p));
  EXPECT_EQ(Allocator::Residency::kDevice, alloc_->residency(p));
  const uint64_t remote = remote_bytes();
  for (int i = 0; i < 2; ++i) ASSERT_CU(cuGraphLaunch(exec, s));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(remote, remote_bytes()) << "the graph read host memory";
  EXPECT_EQ(0u, g_bad.load());
  // The executable holds on its own once the graph is gone.
  ASSERT_CU(cuGraphDestroy(graph));
  ASSERT_NE(CUDA_SUCCESS, alloc_->evict(p));
  ASSERT_CU(cuGraphExecDestroy(exec));
  ASSERT_CU(alloc_->evict(p));
  EXPECT_EQ(Allocator::Residency::kHost, alloc_->residency(p));
  alloc_->free(p, bytes, s);
  cuStreamDestroy_v2(s);
}

TEST_F(TrackerTest, AFailedCaptureGivesItsBlocksBack) {
  const size_t bytes = 4 * MiB;
  CUstream s;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  void* p = alloc_->malloc(bytes, s);
  ASSERT_CU(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  launch_check(p, 0, 22, bytes, s);
  EXPECT_NE(CUDA_SUCCESS, cuStreamSynchronize(s));  // invalidates the capture
  CUgraph graph = nullptr;
  EXPECT_NE(CUDA_SUCCESS, cuStreamEndCapture(s, &graph));
  ASSERT_CU(alloc_->evict(p));
  alloc_->free(p, bytes, s);
  cuStreamDestroy_v2(s);
}

// A stand-in for the process's libcudart lookup of a kernel from its host
// stub, as a libcudart that does not know the stub answers: the error lands
// in the job's cudaGetLastError. spillway must never call it (on an H100 a
// failed lookup made PyTorch raise "invalid device function", docs/gpu.md).
std::atomic<int> g_runtime_lookups{0};
extern "C" cudaError_t cudaGetFuncBySymbol(cudaFunction_t*, const void*) {
  g_runtime_lookups.fetch_add(1);
  return cudaErrorInvalidDeviceFunction;
}

TEST_F(TrackerTest, ARuntimeLaunchIsScannedOnceAndRestoresWithoutTheRuntime) {
  void* p = evicted_block(23);
  CheckArgs a{static_cast<const uint64_t*>(p), 23, 4 * MiB, 0};
  void* params[] = {&a.p, &a.seed, &a.bytes, &a.offset};
  const uint64_t launches = tracker_->launches_seen();
  const uint64_t remote = remote_bytes();
  ASSERT_CU(simcuda_runtime_launch(check_, {1, 1, 1}, {1, 1, 1}, params, 0, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(launches + 1, tracker_->launches_seen()) << "the launch counted twice, or not at all";
  EXPECT_EQ(remote, remote_bytes());
  EXPECT_EQ(Allocator::Residency::kDevice, alloc_->residency(p));
  EXPECT_EQ(0u, g_bad.load());
  EXPECT_EQ(0, g_runtime_lookups.load()) << "spillway called the job's CUDA runtime";
  EXPECT_EQ(0u, tracker_->unseen_runtime_launches());
}

// The policy is told of every access to an evictable block: which block, on
// which stream, at which launch, by which kernel (design.md 7).
TEST_F(TrackerTest, ThePolicyIsToldOfEveryAccess) {
  struct Recorder final : spillway::policy::VictimChooser {
    spillway::policy::LruChooser lru;
    std::vector<spillway::policy::Use> seen;
    std::vector<uint64_t> choose(std::vector<spillway::policy::Candidate> c, size_t need) override {
      return lru.choose(std::move(c), need);
    }
    void on_access(const spillway::policy::Use& a) override { seen.push_back(a); }
  };
  auto chooser = std::make_shared<Recorder>();
  tracker_.reset();  // one subscriber at a time
  std::string why;
  AllocatorOptions o;
  o.chooser = chooser;
  auto alloc = Allocator::create(*driver_, o, &why);
  ASSERT_NE(nullptr, alloc) << why;
  auto tracker = Tracker::start(*api_, *driver_, *alloc, &why);
  ASSERT_NE(nullptr, tracker) << why;
  void* p = alloc->malloc(4 * MiB, nullptr);
  void* q = alloc->malloc(4 * MiB, nullptr);
  CheckArgs a{static_cast<const uint64_t*>(p), 0, 0, 0};
  void* params[] = {&a.p, &a.seed, &a.bytes, &a.offset};
  ASSERT_CU(cuLaunchKernel(check_, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
  ASSERT_CU(cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(q), 0, 64, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  ASSERT_EQ(2u, chooser->seen.size());
  EXPECT_EQ(reinterpret_cast<uint64_t>(p), chooser->seen[0].block);
  EXPECT_EQ(4 * MiB, chooser->seen[0].bytes);
  EXPECT_STREQ("check", chooser->seen[0].kernel);
  EXPECT_EQ(reinterpret_cast<uint64_t>(q), chooser->seen[1].block);
  EXPECT_EQ(nullptr, chooser->seen[1].kernel);
  EXPECT_LT(chooser->seen[0].launch, chooser->seen[1].launch);
  tracker.reset();
  alloc->free(p, 4 * MiB, nullptr);
  alloc->free(q, 4 * MiB, nullptr);
}
