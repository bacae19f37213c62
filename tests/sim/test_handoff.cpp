// Physical memory handed between host threads (docs/sim.md, "Handing
// physical memory between threads"). Each host thread has its own virtual
// clock; on hardware one real timeline orders the thread that gives memory
// up and the thread that takes it. The sim makes the handover explicit:
// cuMemUnmap moves the caller's clock to the end of the latest completed op
// that used the mapping, and cuMemMap of a physical allocation moves the
// caller's clock to that allocation's latest unmap.
//
// Every test starts thread B first, so that its clock is born "now", then
// moves the main thread (A) far ahead with a copy of 64 MiB (more than 1 ms
// of simulated time at 55 GB/s), and checks B is still behind before the
// call under test: without the rule the expectations after it fail.
// Each test runs in its own process (run_isolated) with the default costs.
#include <functional>
#include <future>
#include <thread>

#include "sim_test_extra.h"

using namespace simtest;

namespace {

constexpr size_t kBytes = size_t{64} << 20;
constexpr uint64_t kApiNs = 500;  // SIMCUDA_API_NS default

CUmemAccessDesc read_write() {
  CUmemAccessDesc acc{};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = 0;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return acc;
}

// Thread B: made current on `ctx`, its clock read at once (born "now"), then
// it waits for `go` and runs `body`.
class Behind {
 public:
  Behind(CUcontext ctx, std::function<void()> body)
      : thread_([this, ctx, body = std::move(body)] {
          EXPECT_CU(cuCtxSetCurrent(ctx));
          born_.set_value(simcuda_now_ns());
          go_.get_future().wait();
          body();
        }) {
    born_at_ = born_.get_future().get();
  }
  ~Behind() {
    if (thread_.joinable()) run();  // a failed assertion left it waiting
  }
  uint64_t born_at() const { return born_at_; }
  void run() {
    go_.set_value();
    thread_.join();
  }

 private:
  std::promise<uint64_t> born_;
  std::promise<void> go_;
  uint64_t born_at_ = 0;
  std::thread thread_;
};

// A VA range of `size` with device memory mapped read/write.
struct Mapped {
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle h = 0;
};
Mapped map_device(size_t size) {
  Mapped m;
  const CUmemAllocationProp prop = device_prop();
  const CUmemAccessDesc acc = read_write();
  EXPECT_CU(cuMemAddressReserve(&m.va, size, 0, 0, 0));
  EXPECT_CU(cuMemCreate(&m.h, size, &prop, 0));
  EXPECT_CU(cuMemMap(m.va, size, 0, m.h, 0));
  EXPECT_CU(cuMemSetAccess(m.va, size, &acc, 1));
  return m;
}

// A kernel with one pointer parameter, declaring `duration_ns`: a parameter
// pointing into a mapping makes the kernel a user of the whole mapping.
CUfunction pointer_kernel(uint64_t duration_ns) {
  static const size_t sizes[] = {8};
  simcuda_kernel_desc d{};
  d.name = "pointer_kernel";
  d.fn = [](const void*, size_t, const simcuda_launch_info*, void*) {};
  d.param_sizes = sizes;
  d.num_params = 1;
  d.duration_ns = duration_ns;
  CUfunction f = nullptr;
  EXPECT_CU(simcuda_register_function(&d, &f));
  return f;
}

// Waits for the work of `s` and returns its virtual end (the waiting
// thread's clock right after the wait).
uint64_t wait_end(CUstream s) {
  EXPECT_CU(cuStreamSynchronize(s));
  return simcuda_now_ns();
}

// Thread A runs `op`: it queues uses of `m` on streams (`s` or its own),
// waits for them and returns the virtual end of the latest one; thread B,
// born before, then unmaps `m`: its clock moves to that end, not earlier.
void unmap_by_a_thread_behind(const std::function<uint64_t(CUstream, const Mapped&)>& op) {
  CUcontext ctx = init_primary();
  const Mapped m = map_device(kBytes);
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  uint64_t op_end = 0, before = 0, after = 0;
  CUresult unmapped = CUDA_ERROR_UNKNOWN;
  Behind b(ctx, [&] {
    before = simcuda_now_ns();
    unmapped = cuMemUnmap(m.va, kBytes);
    after = simcuda_now_ns();
  });
  op_end = op(s, m);
  b.run();
  ASSERT_CU(unmapped);
  ASSERT_LT(before + kApiNs, op_end) << "B must be behind the op for the test to mean anything";
  EXPECT_EQ(op_end, after) << "B's unmap waited for the op's end in virtual time";
  EXPECT_CU(cuMemRelease(m.h));
  EXPECT_CU(cuMemAddressFree(m.va, kBytes));
  EXPECT_CU(cuStreamDestroy_v2(s));
}

}  // namespace

// The scenario of spillway's eviction: A copies device memory out, waits,
// unmaps and hands the handle over; B, whose clock is behind, maps it at a
// new address. B's clock is then at A's unmap, so what B queues next is
// placed after the copy that read the old contents.
TEST(SimHandoff, MapOfAHandleWaitsForItsLastUnmap) {
  run_isolated({}, [] {
    CUcontext ctx = init_primary();
    const Mapped a = map_device(kBytes);
    CUdeviceptr b_va = 0, fresh_va = 0;
    ASSERT_CU(cuMemAddressReserve(&b_va, kBytes, 0, 0, 0));
    ASSERT_CU(cuMemAddressReserve(&fresh_va, kBytes, 0, 0, 0));
    CUmemGenericAllocationHandle fresh = 0;
    const CUmemAllocationProp prop = device_prop();
    ASSERT_CU(cuMemCreate(&fresh, kBytes, &prop, 0));
    void* host = nullptr;
    ASSERT_CU(cuMemHostAlloc(&host, kBytes, 0));
    CUstream s = nullptr;
    ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUevent copied = nullptr, b_mapped = nullptr;
    ASSERT_CU(cuEventCreate(&copied, 0));
    ASSERT_CU(cuEventCreate(&b_mapped, 0));

    uint64_t copy_end = 0, unmapped_at = 0;
    uint64_t fresh_before = 0, fresh_after = 0, before = 0, after = 0;
    Behind b(ctx, [&] {
      // A handle nobody unmapped: the map costs its API cost only.
      fresh_before = simcuda_now_ns();
      EXPECT_CU(cuMemMap(fresh_va, kBytes, 0, fresh, 0));
      fresh_after = simcuda_now_ns();
      // The handle A gave up.
      before = simcuda_now_ns();
      EXPECT_CU(cuMemMap(b_va, kBytes, 0, a.h, 0));
      after = simcuda_now_ns();
      CUstream bs = nullptr;
      EXPECT_CU(cuStreamCreate(&bs, CU_STREAM_NON_BLOCKING));
      EXPECT_CU(cuEventRecord(b_mapped, bs));
      EXPECT_CU(cuStreamSynchronize(bs));
      EXPECT_CU(cuStreamDestroy_v2(bs));
    });

    // A: the eviction copy, its wait, the unmap.
    ASSERT_CU(cuMemcpyDtoHAsync_v2(host, a.va, kBytes, s));
    ASSERT_CU(cuEventRecord(copied, s));
    ASSERT_CU(cuStreamSynchronize(s));
    copy_end = simcuda_now_ns();
    ASSERT_CU(cuMemUnmap(a.va, kBytes));
    unmapped_at = simcuda_now_ns();
    EXPECT_EQ(copy_end + kApiNs, unmapped_at);
    b.run();

    EXPECT_EQ(kApiNs, fresh_after - fresh_before);
    ASSERT_LT(before + kApiNs, copy_end)
        << "B must be behind the copy for the test to mean anything";
    EXPECT_EQ(unmapped_at, after) << "B's map starts at A's unmap";
    EXPECT_GE(after, copy_end);
    // In virtual time, what B queues after the map comes after the copy.
    ASSERT_CU(cuEventSynchronize(b_mapped));
    float ms = -1;
    ASSERT_CU(cuEventElapsedTime_v2(&ms, copied, b_mapped));
    EXPECT_GE(ms, 0.0f);

    ASSERT_CU(cuMemUnmap(b_va, kBytes));
    ASSERT_CU(cuMemUnmap(fresh_va, kBytes));
    EXPECT_CU(cuMemRelease(a.h));
    EXPECT_CU(cuMemRelease(fresh));
    EXPECT_CU(cuMemAddressFree(a.va, kBytes));
    EXPECT_CU(cuMemAddressFree(b_va, kBytes));
    EXPECT_CU(cuMemAddressFree(fresh_va, kBytes));
    EXPECT_CU(cuMemFreeHost(host));
  });
}

// A thread whose clock is ahead of the unmap is not moved back.
TEST(SimHandoff, MapByAThreadAheadKeepsItsClock) {
  run_isolated({}, [] {
    init_primary();
    const Mapped a = map_device(kBytes);
    ASSERT_CU(cuMemUnmap(a.va, kBytes));
    simcuda_host_advance_ns(1'000'000);
    const uint64_t before = simcuda_now_ns();
    ASSERT_CU(cuMemMap(a.va, kBytes, 0, a.h, 0));
    EXPECT_EQ(before + kApiNs, simcuda_now_ns());
    ASSERT_CU(cuMemUnmap(a.va, kBytes));
    EXPECT_CU(cuMemRelease(a.h));
    EXPECT_CU(cuMemAddressFree(a.va, kBytes));
  });
}

// An unmap by a thread whose clock is behind the end of the latest op on the
// mapping: a copy out of it, a memset of it, a kernel given a pointer into it.
TEST(SimHandoff, UnmapWaitsForTheEndOfACopy) {
  run_isolated({}, [] {
    void* host = nullptr;
    unmap_by_a_thread_behind([&](CUstream s, const Mapped& m) {
      EXPECT_CU(cuMemHostAlloc(&host, kBytes, 0));
      EXPECT_CU(cuMemcpyDtoHAsync_v2(host, m.va, kBytes, s));
      return wait_end(s);
    });
    EXPECT_CU(cuMemFreeHost(host));
  });
}

TEST(SimHandoff, UnmapWaitsForTheEndOfAMemset) {
  run_isolated({}, [] {
    unmap_by_a_thread_behind([](CUstream s, const Mapped& m) {
      // 64 MiB at 3000 GB/s is only ~22 us: 1 ms of host work first puts A's
      // clock well ahead of B's.
      simcuda_host_advance_ns(1'000'000);
      EXPECT_CU(cuMemsetD8Async(m.va, 0xA5, kBytes, s));
      return wait_end(s);
    });
  });
}

TEST(SimHandoff, UnmapWaitsForTheEndOfAKernel) {
  run_isolated({}, [] {
    unmap_by_a_thread_behind([](CUstream s, const Mapped& m) {
      CUfunction k = pointer_kernel(2'000'000);
      // A pointer into the middle of the mapping: the whole mapping is used.
      CUdeviceptr p = m.va + kBytes / 2;
      void* params[] = {&p};
      EXPECT_CU(launch(k, s, params));
      return wait_end(s);
    });
  });
}

// Several ops on two engines: the latest end counts, not the op queued last.
TEST(SimHandoff, UnmapWaitsForTheLatestOfSeveralOps) {
  run_isolated({}, [] {
    void* host = nullptr;
    unmap_by_a_thread_behind([&](CUstream s, const Mapped& m) {
      EXPECT_CU(cuMemHostAlloc(&host, 4096, 0));
      CUstream other = nullptr;
      EXPECT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
      CUfunction k = pointer_kernel(3'000'000);
      CUdeviceptr p = m.va;
      void* params[] = {&p};
      EXPECT_CU(launch(k, other, params));  // compute engine: ends last
      // The copy engine is free: this copy ends long before the kernel.
      EXPECT_CU(cuMemcpyDtoHAsync_v2(host, m.va, 4096, s));
      const uint64_t copy_end = wait_end(s);
      const uint64_t kernel_end = wait_end(other);
      EXPECT_LT(copy_end + 1'000'000, kernel_end);
      EXPECT_CU(cuStreamDestroy_v2(other));
      return kernel_end;
    });
    EXPECT_CU(cuMemFreeHost(host));
  });
}
