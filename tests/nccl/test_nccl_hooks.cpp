// spillway's NCCL interposition (shim/src/nccl_hooks.cpp, compiled into this
// program so that its definitions come before libnccl.so.2's, as they do when
// libspillway.so is preloaded) with the runtime and the NCCL stand-in on the
// simulated GPU. The runtime reads its configuration from the environment
// set in main().
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <simnccl.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "runtime.h"
#include "sim_test_util.h"

using spillway::Allocator;
using spillway::Runtime;
using namespace simtest;

namespace {

// Not a datatype, but within the enum's range of values (0..15), so the
// conversion is defined.
constexpr ncclDataType_t kBadType = static_cast<ncclDataType_t>(15);

#define ASSERT_NCCL(expr) ASSERT_EQ(ncclSuccess, (expr)) << #expr
constexpr size_t MiB = 1ull << 20;
constexpr size_t kBlock = 4 * MiB;  // the budget (main) holds 6
constexpr size_t kN = kBlock / 4;   // floats per block

float pattern(int rank, size_t i) {
  return static_cast<float>((i % 1000) * (rank + 1));
}

// The stand-in's own ncclAllReduce, not ours: what a job without spillway's
// interposition would call.
using AllReduceFn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                     ncclComm_t, cudaStream_t);
AllReduceFn unhooked_all_reduce() {
  void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  EXPECT_NE(nullptr, h);
  auto f = reinterpret_cast<AllReduceFn>(dlsym(h, "ncclAllReduce"));
  EXPECT_NE(reinterpret_cast<void*>(f), reinterpret_cast<void*>(&ncclAllReduce));
  return f;
}

// Without a runtime the calls go straight through. (First in this file: it
// needs a process where nothing has started spillway, which ctest gives
// every test.)
TEST(NcclHooksInactive, ForwardWhenSpillwayIsNotServingAllocations) {
  if (Runtime::peek()) GTEST_SKIP() << "spillway already started in this process";
  init_primary();
  ncclComm_t comm;
  ASSERT_NCCL(ncclCommInitAll(&comm, 1, nullptr));
  CUdeviceptr a = 0, b = 0;
  ASSERT_CU(cuMemAlloc_v2(&a, 4096));
  ASSERT_CU(cuMemAlloc_v2(&b, 4096));
  std::vector<uint32_t> h(1024, 42), got(1024);
  ASSERT_CU(cuMemcpyHtoD_v2(a, h.data(), 4096));
  const uint64_t done = simnccl_ops_completed();
  ASSERT_NCCL(ncclGroupStart());
  ASSERT_NCCL(ncclAllReduce(reinterpret_cast<void*>(a), reinterpret_cast<void*>(b), 1024,
                            ncclUint32, ncclSum, comm, nullptr));
  ASSERT_NCCL(ncclGroupEnd());
  ASSERT_CU(cuStreamSynchronize(nullptr));
  ASSERT_CU(cuMemcpyDtoH_v2(got.data(), b, 4096));
  EXPECT_EQ(h, got);
  EXPECT_EQ(done + 1, simnccl_ops_completed());
  EXPECT_EQ(nullptr, Runtime::peek()) << "an NCCL call started spillway";
  EXPECT_EQ(ncclSuccess, ncclCommDestroy(comm));
  EXPECT_CU(cuMemFree_v2(a));
  EXPECT_CU(cuMemFree_v2(b));
}

class NcclHooks : public ::testing::Test {
 protected:
  void SetUp() override {
    init_primary();
    alloc_ = Runtime::get().allocator(0);
    ASSERT_NE(nullptr, alloc_);
    const int devs[2] = {0, 0};
    ASSERT_NCCL(ncclCommInitAll(comms_, 2, devs));
    // Streams live as long as the process, as PyTorch's do: blocks freed to
    // a stream's cache are released by draining it.
    static CUstream streams[3] = {};
    if (!streams[0]) {
      for (auto& s : streams) ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    }
    compute_ = streams[0];
    nccl_[0] = streams[1];
    nccl_[1] = streams[2];
    changes_ = simnccl_mapping_changes();
  }
  void TearDown() override {
    simnccl_set_delay_us(0);
    for (auto s : nccl_) EXPECT_CU(cuStreamSynchronize(s));
    EXPECT_CU(cuStreamSynchronize(compute_));
    for (auto c : comms_) EXPECT_EQ(ncclSuccess, ncclCommDestroy(c));
    drop_fillers();
    for (auto [p, s] : blocks_) alloc_->free(p, kBlock, s);
    char buf[256];
    EXPECT_EQ(CUDA_SUCCESS, simcuda_sticky_error(0, buf, sizeof buf)) << buf;
  }

  // A block of kBlock bytes made on the compute stream (as PyTorch makes
  // gradient buckets), holding pattern(rank).
  void* block(int rank) {
    void* p = alloc_->malloc(kBlock, compute_);
    EXPECT_NE(nullptr, p);
    std::vector<float> h(kN);
    for (size_t i = 0; i < kN; ++i) h[i] = pattern(rank, i);
    EXPECT_CU(cuMemcpyHtoDAsync_v2(reinterpret_cast<CUdeviceptr>(p), h.data(), kBlock, compute_));
    EXPECT_CU(cuStreamSynchronize(compute_));
    blocks_.push_back({p, compute_});
    return p;
  }
  std::vector<float> read(void* p) {
    std::vector<float> h(kN);
    EXPECT_CU(cuMemcpyDtoH_v2(h.data(), reinterpret_cast<CUdeviceptr>(p), kBlock));
    return h;
  }
  // Evicts `p` now. The background thread may be evicting it already
  // (NOT_READY), and a collective's hold is released by spillway's releaser
  // thread once the collective's stream is done, which may come a moment
  // after the test's cuStreamSynchronize returns (OUT_OF_MEMORY while held).
  void evict(void* p) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      CUresult r = alloc_->evict(p);
      if (r == CUDA_SUCCESS && alloc_->residency(p) == Allocator::Residency::kHost) return;
      ASSERT_TRUE(r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_READY || r == CUDA_ERROR_OUT_OF_MEMORY)
          << r;
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "cannot evict " << p;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  bool on_device(void* p) { return alloc_->residency(p) == Allocator::Residency::kDevice; }
  // Where `p` is once an eviction in flight has finished: a use during the
  // background thread's copy cancels it, and the block reads kEvicting until
  // that batch ends, then kDevice.
  Allocator::Residency settled(void* p) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    Allocator::Residency r = alloc_->residency(p);
    while (r == Allocator::Residency::kEvicting && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      r = alloc_->residency(p);
    }
    return r;
  }
  // Allocations past the budget: the allocator evicts what it may.
  void pressure(int blocks) {
    for (int i = 0; i < blocks; ++i) {
      void* p = alloc_->malloc(kBlock, compute_);
      ASSERT_NE(nullptr, p) << "filler " << i;
      fillers_.push_back(p);
    }
  }
  void drop_fillers() {
    for (void* p : fillers_) alloc_->free(p, kBlock, compute_);
    fillers_.clear();
  }
  // Waits until pressure evicts `p` (its holds are gone), or gives up.
  bool becomes_evictable(void* p) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      pressure(6);
      drop_fillers();
      if (alloc_->residency(p) == Allocator::Residency::kHost) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  void expect_sums(void* const* bufs, int n) {
    for (int r = 0; r < n; ++r) {
      std::vector<float> got = read(bufs[r]);
      for (size_t i = 0; i < kN; ++i)
        ASSERT_EQ(pattern(0, i) + pattern(1, i), got[i]) << "rank " << r << " element " << i;
    }
  }
  void expect_no_async_error() {
    for (auto c : comms_) {
      ncclResult_t e = ncclInternalError;
      ASSERT_NCCL(ncclCommGetAsyncError(c, &e));
      EXPECT_EQ(ncclSuccess, e) << ncclGetErrorString(e);
    }
  }
  ncclResult_t all_reduce_group(void* const* bufs) {
    ncclResult_t r = ncclGroupStart();
    for (int k = 0; k < 2 && r == ncclSuccess; ++k)
      r = ncclAllReduce(bufs[k], bufs[k], kN, ncclFloat, ncclSum, comms_[k], nccl_[k]);
    ncclResult_t e = ncclGroupEnd();
    return r != ncclSuccess ? r : e;
  }

  Allocator* alloc_ = nullptr;
  ncclComm_t comms_[2] = {};
  CUstream compute_ = nullptr;
  CUstream nccl_[2] = {};
  std::vector<std::pair<void*, CUstream>> blocks_;
  std::vector<void*> fillers_;
  uint64_t changes_ = 0;
};

TEST_F(NcclHooks, ACollectiveOnEvictedBuffersGetsTheRightBytes) {
  void* bufs[2] = {block(0), block(1)};
  for (void* p : bufs) ASSERT_NO_FATAL_FAILURE(evict(p));
  const uint64_t restored = Runtime::get().stats().blocks_restored;
  ASSERT_NCCL(all_reduce_group(bufs));
  // Restored before the call reached NCCL.
  for (void* p : bufs) EXPECT_EQ(Allocator::Residency::kDevice, alloc_->residency(p));
  EXPECT_LE(restored + 2, Runtime::get().stats().blocks_restored);
  for (auto s : nccl_) ASSERT_CU(cuStreamSynchronize(s));
  expect_sums(bufs, 2);
  expect_no_async_error();
  EXPECT_EQ(changes_, simnccl_mapping_changes());
}

TEST_F(NcclHooks, BuffersStayOnTheDeviceWhileTheCollectiveRunsThenBecomeEvictable) {
  void* bufs[2] = {block(0), block(1)};
  simnccl_set_delay_us(300000);
  ASSERT_NCCL(all_reduce_group(bufs));
  // The kernels are waiting: make the allocator evict (the buffers are the
  // least recently used blocks, its first choice if it may).
  ASSERT_NO_FATAL_FAILURE(pressure(6));
  EXPECT_GT(Runtime::get().stats().blocks_evicted, 0u);
  for (void* p : bufs) EXPECT_EQ(Allocator::Residency::kDevice, alloc_->residency(p));
  for (auto s : nccl_) ASSERT_CU(cuStreamSynchronize(s));
  simnccl_set_delay_us(0);
  EXPECT_EQ(changes_, simnccl_mapping_changes()) << "a buffer was remapped under the collective";
  expect_no_async_error();
  drop_fillers();
  expect_sums(bufs, 2);
  // The stream work is done: the holds go, and the blocks may be evicted.
  for (void* p : bufs) EXPECT_TRUE(becomes_evictable(p));
}

// Without the interposition (the same call made to the stand-in directly) the
// allocator, which cannot see the kernel's pointers, evicts a buffer under
// the running collective, and the stand-in reports it: the check above has
// teeth.
TEST_F(NcclHooks, WithoutTheHooksTheSameScenarioRemapsABufferUnderTheCollective) {
#ifdef SIMTEST_TSAN
  GTEST_SKIP()
      << "remaps memory a running kernel reads, unsynchronized on purpose: a race by design";
#endif
  AllReduceFn direct = unhooked_all_reduce();
  ASSERT_NE(nullptr, direct);
  void* bufs[2] = {block(0), block(1)};
  simnccl_set_delay_us(300000);
  ASSERT_NCCL(ncclGroupStart());
  for (int k = 0; k < 2; ++k)
    ASSERT_NCCL(direct(bufs[k], bufs[k], kN, ncclFloat, ncclSum, comms_[k], nccl_[k]));
  ASSERT_NCCL(ncclGroupEnd());
  ASSERT_NO_FATAL_FAILURE(pressure(6));
  for (auto s : nccl_) ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_GT(simnccl_mapping_changes(), changes_);
  int failed = 0;
  for (auto c : comms_) {
    ncclResult_t e = ncclSuccess;
    ASSERT_NCCL(ncclCommGetAsyncError(c, &e));
    EXPECT_TRUE(e == ncclSuccess || e == ncclUnhandledCudaError) << e;
    failed += e == ncclUnhandledCudaError;
  }
  EXPECT_GT(failed, 0);
  // The bytes are still right: the evicted block stays mapped (contract 2).
  drop_fillers();
  expect_sums(bufs, 2);
}

TEST_F(NcclHooks, AGroupHoldsItsBuffersFromEachCallUntilItsWorkIsDone) {
  void* bufs[2] = {block(0), block(1)};
  ASSERT_NO_FATAL_FAILURE(evict(bufs[0]));
  ASSERT_NCCL(ncclGroupStart());
  ASSERT_NCCL(ncclAllReduce(bufs[0], bufs[0], kN, ncclFloat, ncclSum, comms_[0], nccl_[0]));
  EXPECT_EQ(Allocator::Residency::kDevice, alloc_->residency(bufs[0]));
  // Nothing is queued yet; rank 0's buffer must stay put meanwhile.
  ASSERT_NO_FATAL_FAILURE(pressure(6));
  EXPECT_EQ(Allocator::Residency::kDevice, alloc_->residency(bufs[0]));
  EXPECT_FALSE(on_device(bufs[1]));  // not called yet: evicted (or being evicted)
  ASSERT_NCCL(ncclAllReduce(bufs[1], bufs[1], kN, ncclFloat, ncclSum, comms_[1], nccl_[1]));
  EXPECT_EQ(Allocator::Residency::kDevice, settled(bufs[1]));
  drop_fillers();
  ASSERT_NCCL(ncclGroupEnd());
  for (auto s : nccl_) ASSERT_CU(cuStreamSynchronize(s));
  expect_sums(bufs, 2);
  expect_no_async_error();
  EXPECT_EQ(changes_, simnccl_mapping_changes());
  for (void* p : bufs) EXPECT_TRUE(becomes_evictable(p));
}

TEST_F(NcclHooks, EveryInterposedCallRestoresTheBuffersItUses) {
  // AllGather: rank r's 2 MiB go to both receive buffers (whole blocks).
  void* send[2] = {block(0), block(1)};
  void* recv[2] = {block(0), block(0)};
  auto evict_all = [&] {
    for (void* p : send) ASSERT_NO_FATAL_FAILURE(evict(p));
    for (void* p : recv) ASSERT_NO_FATAL_FAILURE(evict(p));
  };
  auto all_resident = [&](void* const* ps) {
    for (int k = 0; k < 2; ++k)
      EXPECT_EQ(Allocator::Residency::kDevice, alloc_->residency(ps[k])) << k;
  };
  const size_t half = kN / 2;
  evict_all();
  ASSERT_NCCL(ncclGroupStart());
  for (int k = 0; k < 2; ++k)
    ASSERT_NCCL(ncclAllGather(send[k], recv[k], half, ncclFloat, comms_[k], nccl_[k]));
  ASSERT_NCCL(ncclGroupEnd());
  all_resident(send);
  all_resident(recv);
  for (auto s : nccl_) ASSERT_CU(cuStreamSynchronize(s));
  for (int k = 0; k < 2; ++k) {
    std::vector<float> got = read(recv[k]);
    for (size_t i = 0; i < half; ++i) {
      ASSERT_EQ(pattern(0, i), got[i]);
      ASSERT_EQ(pattern(1, i), got[half + i]);
    }
  }

  evict_all();
  ASSERT_NCCL(ncclGroupStart());
  for (int k = 0; k < 2; ++k)
    ASSERT_NCCL(ncclReduceScatter(send[k], recv[k], half, ncclFloat, ncclSum, comms_[k], nccl_[k]));
  ASSERT_NCCL(ncclGroupEnd());
  all_resident(send);
  all_resident(recv);
  for (auto s : nccl_) ASSERT_CU(cuStreamSynchronize(s));
  std::vector<float> got = read(recv[1]);
  for (size_t i = 0; i < half; ++i) ASSERT_EQ(pattern(0, half + i) + pattern(1, half + i), got[i]);

  evict_all();
  ASSERT_NCCL(ncclGroupStart());
  for (int k = 0; k < 2; ++k)
    ASSERT_NCCL(ncclBroadcast(send[k], recv[k], kN, ncclFloat, 1, comms_[k], nccl_[k]));
  ASSERT_NCCL(ncclGroupEnd());
  EXPECT_FALSE(on_device(send[0]));  // not the root's: not restored
  EXPECT_EQ(Allocator::Residency::kDevice, alloc_->residency(send[1]));
  all_resident(recv);
  for (auto s : nccl_) ASSERT_CU(cuStreamSynchronize(s));
  got = read(recv[0]);
  for (size_t i = 0; i < kN; ++i) ASSERT_EQ(pattern(1, i), got[i]);

  evict_all();
  ASSERT_NCCL(ncclGroupStart());
  for (int k = 0; k < 2; ++k)
    ASSERT_NCCL(ncclReduce(send[k], recv[k], kN, ncclFloat, ncclMax, 0, comms_[k], nccl_[k]));
  ASSERT_NCCL(ncclGroupEnd());
  all_resident(send);
  EXPECT_EQ(Allocator::Residency::kDevice, alloc_->residency(recv[0]));
  EXPECT_FALSE(on_device(recv[1]));  // not the root's: not restored
  for (auto s : nccl_) ASSERT_CU(cuStreamSynchronize(s));
  got = read(recv[0]);
  for (size_t i = 0; i < kN; ++i) ASSERT_EQ(pattern(1, i), got[i]);

  evict_all();
  ASSERT_NCCL(ncclGroupStart());
  for (int k = 0; k < 2; ++k) {
    ASSERT_NCCL(ncclSend(send[k], kN, ncclFloat, 1 - k, comms_[k], nccl_[k]));
    ASSERT_NCCL(ncclRecv(recv[k], kN, ncclFloat, 1 - k, comms_[k], nccl_[k]));
  }
  ASSERT_NCCL(ncclGroupEnd());
  all_resident(send);
  all_resident(recv);
  for (auto s : nccl_) ASSERT_CU(cuStreamSynchronize(s));
  for (int k = 0; k < 2; ++k) {
    got = read(recv[k]);
    for (size_t i = 0; i < kN; ++i) ASSERT_EQ(pattern(1 - k, i), got[i]);
  }
  expect_no_async_error();
  EXPECT_EQ(changes_, simnccl_mapping_changes());
  for (void* p : send) EXPECT_TRUE(becomes_evictable(p));
  for (void* p : recv) EXPECT_TRUE(becomes_evictable(p));
}

TEST_F(NcclHooks, AFailedCallReleasesAtOnce) {
  void* p = block(0);
  ASSERT_NO_FATAL_FAILURE(evict(p));
  EXPECT_EQ(ncclInvalidArgument, ncclAllReduce(p, p, kN, kBadType, ncclSum, comms_[0], nccl_[0]));
  // Restored for the call, but not held: the next pressure may evict it.
  EXPECT_TRUE(becomes_evictable(p));
}

}  // namespace

int main(int argc, char** argv) {
  // The runtime's configuration: a small budget, and the simulator's CUPTI
  // (a real libcupti.so.13 may be on the library path).
  setenv("SPILLWAY_GPU_BUDGET", "24MiB", 1);
  setenv("SPILLWAY_CUPTI_PATH", SIM_CUPTI_PATH, 1);
  setenv("SPILLWAY_LOG_LEVEL", "error", 1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
