// The virtual clock: copy engines, the compute engine, bandwidth sharing,
// host costs and host waits. Every expectation is derived from the model
// (docs/sim.md, sim/src/clock.cpp): a copy takes ceil(bytes / rate) ns on its
// direction's engine, at SIMCUDA_BIDIR_GBPS while the opposite engine is
// busy (work placed earlier keeps its times); device-to-device copies take
// ceil(2 * bytes / HBM) on the compute engine; kernels take their declared
// duration; a driver call costs SIMCUDA_API_NS (launches SIMCUDA_LAUNCH_NS).
//
// Each test runs in its own process (run_isolated) with a known SIMCUDA_*
// environment, and measures between events recorded right after gate(): all
// measured work starts at the same virtual instant T, so the expectations are
// exact to the nanosecond (within float resolution of cuEventElapsedTime).
#include <cmath>
#include <cstring>
#include <vector>

#include "sim_test_extra.h"

using namespace simtest;

namespace {

// Nanosecond resolution of a float millisecond value up to ~30 ms.
constexpr double kTol = 3.0;

uint64_t ceil_div(double bytes, double rate) {
  return static_cast<uint64_t>(std::ceil(bytes / rate));
}

// Pinned host memory and device memory of `n` bytes each.
struct Buffers {
  void* host = nullptr;
  CUdeviceptr dev = 0;
  size_t n = 0;
};

Buffers alloc_buffers(size_t n) {
  Buffers b;
  b.n = n;
  EXPECT_CU(cuMemHostAlloc(&b.host, n, 0));
  EXPECT_CU(cuMemAlloc_v2(&b.dev, n));
  return b;
}

void free_buffers(const Buffers& b) {
  EXPECT_CU(cuMemFreeHost(b.host));
  EXPECT_CU(cuMemFree_v2(b.dev));
}

CUevent timing_event() {
  CUevent e = nullptr;
  EXPECT_CU(cuEventCreate(&e, 0));
  return e;
}

CUstream new_stream() {
  CUstream s = nullptr;
  EXPECT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  return s;
}

}  // namespace

TEST(SimClock, HostToDevice1GiBFromPinnedAt55GBps) {
  run_isolated({}, [] {
    init_primary();
    constexpr size_t kBytes = 1ull << 30;
    VmmBlock blk;
    ASSERT_CU(map_block(&blk, kBytes, device_prop()));
    void* host = nullptr;
    ASSERT_CU(cuMemHostAlloc(&host, kBytes, 0));
    auto* h = static_cast<unsigned char*>(host);
    for (size_t off : {size_t{0}, kBytes / 3, kBytes - 4096}) std::memset(h + off, 0x5A, 4096);
    CUstream s = new_stream();
    CUevent start = timing_event(), end = timing_event();
    simcuda_memory_stats before{}, after{};
    simcuda_get_memory_stats(0, &before);

    gate({s});
    ASSERT_CU(cuEventRecord(start, s));
    ASSERT_CU(cuMemcpyHtoDAsync_v2(blk.ptr, host, kBytes, s));
    ASSERT_CU(cuEventRecord(end, s));
    ASSERT_CU(cuEventSynchronize(end));

    const double expect_ns = 1073741824.0 / 55.0;  // 19.52 ms
    const double got_ns = elapsed_ns(start, end);
    EXPECT_NEAR(expect_ns, got_ns, 0.01 * expect_ns);
    simcuda_get_memory_stats(0, &after);
    EXPECT_EQ(kBytes, after.bytes_h2d - before.bytes_h2d);
    std::vector<unsigned char> back(4096);
    for (size_t off : {size_t{0}, kBytes / 3, kBytes - 4096}) {
      ASSERT_CU(cuMemcpyDtoH_v2(back.data(), blk.ptr + off, back.size()));
      EXPECT_EQ(0, std::memcmp(back.data(), h + off, back.size())) << "offset " << off;
    }

    ASSERT_CU(cuEventDestroy_v2(start));
    ASSERT_CU(cuEventDestroy_v2(end));
    ASSERT_CU(cuStreamDestroy_v2(s));
    ASSERT_CU(cuMemFreeHost(host));
    unmap_block(blk);
  });
}

TEST(SimClock, SameDirectionCopiesOnTwoStreamsSerialize) {
  run_isolated({}, [] {
    init_primary();
    constexpr size_t kBytes = 8ull << 20;
    const double d = static_cast<double>(ceil_div(kBytes, 55.0));  // 152521 ns
    Buffers a = alloc_buffers(kBytes), b = alloc_buffers(kBytes);
    CUstream s1 = new_stream(), s2 = new_stream();
    CUevent start = timing_event(), e1 = timing_event(), e2 = timing_event();

    // Host to device, both on the H2D engine.
    gate({s1, s2});
    ASSERT_CU(cuEventRecord(start, s1));
    ASSERT_CU(cuMemcpyHtoDAsync_v2(a.dev, a.host, kBytes, s1));
    ASSERT_CU(cuMemcpyHtoDAsync_v2(b.dev, b.host, kBytes, s2));
    ASSERT_CU(cuEventRecord(e1, s1));
    ASSERT_CU(cuEventRecord(e2, s2));
    ASSERT_CU(cuCtxSynchronize());
    EXPECT_NEAR(d, elapsed_ns(start, e1), kTol);
    EXPECT_NEAR(2 * d, elapsed_ns(start, e2), kTol)
        << "the second H2D copy must wait for the first";

    // Device to host, both on the D2H engine.
    gate({s1, s2});
    ASSERT_CU(cuEventRecord(start, s2));
    ASSERT_CU(cuMemcpyDtoHAsync_v2(b.host, b.dev, kBytes, s2));
    ASSERT_CU(cuMemcpyDtoHAsync_v2(a.host, a.dev, kBytes, s1));
    ASSERT_CU(cuEventRecord(e1, s1));
    ASSERT_CU(cuEventRecord(e2, s2));
    ASSERT_CU(cuCtxSynchronize());
    EXPECT_NEAR(d, elapsed_ns(start, e2), kTol);
    EXPECT_NEAR(2 * d, elapsed_ns(start, e1), kTol)
        << "the second D2H copy must wait for the first";

    for (CUevent e : {start, e1, e2}) ASSERT_CU(cuEventDestroy_v2(e));
    ASSERT_CU(cuStreamDestroy_v2(s1));
    ASSERT_CU(cuStreamDestroy_v2(s2));
    free_buffers(a);
    free_buffers(b);
  });
}

TEST(SimClock, CopyAndKernelOnTwoStreamsOverlap) {
  run_isolated({}, [] {
    init_primary();
    constexpr size_t kBytes = 8ull << 20;
    const double d = static_cast<double>(ceil_div(kBytes, 55.0));  // 152521 ns
    constexpr uint64_t kKernel = 200'000;
    Buffers a = alloc_buffers(kBytes);
    CUstream s1 = new_stream(), s2 = new_stream();
    CUevent start = timing_event(), e1 = timing_event(), e2 = timing_event();

    gate({s1, s2});
    ASSERT_CU(cuEventRecord(start, s1));
    ASSERT_CU(cuMemcpyHtoDAsync_v2(a.dev, a.host, kBytes, s1));
    ASSERT_CU(launch(nop_kernel(kKernel), s2, nullptr));
    ASSERT_CU(cuEventRecord(e1, s1));
    ASSERT_CU(cuEventRecord(e2, s2));
    ASSERT_CU(cuCtxSynchronize());
    const double copy_end = elapsed_ns(start, e1), kernel_end = elapsed_ns(start, e2);
    EXPECT_NEAR(d, copy_end, kTol);
    EXPECT_NEAR(static_cast<double>(kKernel), kernel_end, kTol)
        << "the kernel must not wait for the copy engine";
    EXPECT_NEAR(std::max(d, static_cast<double>(kKernel)), std::max(copy_end, kernel_end), kTol)
        << "total must be the longer of the two, not the sum";

    for (CUevent e : {start, e1, e2}) ASSERT_CU(cuEventDestroy_v2(e));
    ASSERT_CU(cuStreamDestroy_v2(s1));
    ASSERT_CU(cuStreamDestroy_v2(s2));
    free_buffers(a);
  });
}

// H2D placed first keeps the one-way rate; D2H placed second runs at
// SIMCUDA_BIDIR_GBPS (30 here) while the H2D engine is busy, and at the
// one-way rate once it is idle again.
TEST(SimClock, OppositeDirectionCopiesOverlapAtBidirectionalRate) {
  run_isolated({{"SIMCUDA_BIDIR_GBPS", "30"}}, [] {
    init_primary();
    constexpr size_t kBig = 5'500'000;    // 100000 ns at 55 bytes/ns
    constexpr size_t kSmall = 1'500'000;  // 50000 ns at 30 bytes/ns, within the overlap
    Buffers up = alloc_buffers(kBig), down = alloc_buffers(kBig);
    CUstream s1 = new_stream(), s2 = new_stream();
    CUevent start = timing_event(), e1 = timing_event(), e2 = timing_event();

    auto round = [&](bool h2d_first, size_t first_bytes, size_t second_bytes, double want_first,
                     double want_second) {
      gate({s1, s2});
      ASSERT_CU(cuEventRecord(start, s1));
      if (h2d_first) {
        ASSERT_CU(cuMemcpyHtoDAsync_v2(up.dev, up.host, first_bytes, s1));
        ASSERT_CU(cuMemcpyDtoHAsync_v2(down.host, down.dev, second_bytes, s2));
      } else {
        ASSERT_CU(cuMemcpyDtoHAsync_v2(down.host, down.dev, first_bytes, s1));
        ASSERT_CU(cuMemcpyHtoDAsync_v2(up.dev, up.host, second_bytes, s2));
      }
      ASSERT_CU(cuEventRecord(e1, s1));
      ASSERT_CU(cuEventRecord(e2, s2));
      ASSERT_CU(cuCtxSynchronize());
      EXPECT_NEAR(want_first, elapsed_ns(start, e1), kTol) << "copy placed first";
      EXPECT_NEAR(want_second, elapsed_ns(start, e2), kTol) << "copy placed second";
    };

    // Wholly inside the overlap: bytes / 30.
    round(true, kBig, kSmall, 100'000, 1'500'000 / 30.0);
    // Partly: 100000 ns at 30 bytes/ns (3e6 bytes), the other 2.5e6 at 55.
    round(true, kBig, kBig, 100'000, 100'000 + static_cast<double>(ceil_div(2'500'000, 55.0)));
    // Same with the directions swapped.
    round(false, kBig, kSmall, 100'000, 1'500'000 / 30.0);

    for (CUevent e : {start, e1, e2}) ASSERT_CU(cuEventDestroy_v2(e));
    ASSERT_CU(cuStreamDestroy_v2(s1));
    ASSERT_CU(cuStreamDestroy_v2(s2));
    free_buffers(up);
    free_buffers(down);
  });
}

TEST(SimClock, OppositeDirectionDefaultBidirectionalRateIs45) {
  run_isolated({}, [] {
    init_primary();
    Buffers up = alloc_buffers(5'500'000), down = alloc_buffers(900'000);
    CUstream s1 = new_stream(), s2 = new_stream();
    CUevent start = timing_event(), e1 = timing_event(), e2 = timing_event();
    gate({s1, s2});
    ASSERT_CU(cuEventRecord(start, s1));
    ASSERT_CU(cuMemcpyHtoDAsync_v2(up.dev, up.host, up.n, s1));
    ASSERT_CU(cuMemcpyDtoHAsync_v2(down.host, down.dev, down.n, s2));
    ASSERT_CU(cuEventRecord(e1, s1));
    ASSERT_CU(cuEventRecord(e2, s2));
    ASSERT_CU(cuCtxSynchronize());
    EXPECT_NEAR(100'000, elapsed_ns(start, e1), kTol);
    EXPECT_NEAR(900'000 / 45.0, elapsed_ns(start, e2), kTol);
    for (CUevent e : {start, e1, e2}) ASSERT_CU(cuEventDestroy_v2(e));
    ASSERT_CU(cuStreamDestroy_v2(s1));
    ASSERT_CU(cuStreamDestroy_v2(s2));
    free_buffers(up);
    free_buffers(down);
  });
}

TEST(SimClock, DeviceToDeviceCopyCostsTwiceBytesOverHbmOnComputeEngine) {
  run_isolated({}, [] {
    init_primary();
    constexpr size_t kBytes = 6ull << 20;  // 2 * 6291456 / 3000 = 4194.3 -> 4195 ns
    const double d = static_cast<double>(ceil_div(2.0 * kBytes, 3000.0));
    CUdeviceptr a = 0, b = 0;
    ASSERT_CU(cuMemAlloc_v2(&a, kBytes));
    ASSERT_CU(cuMemAlloc_v2(&b, kBytes));
    CUstream s1 = new_stream(), s2 = new_stream();
    CUevent start = timing_event(), e1 = timing_event(), e2 = timing_event();

    gate({s1});
    ASSERT_CU(cuEventRecord(start, s1));
    ASSERT_CU(cuMemcpyDtoDAsync_v2(b, a, kBytes, s1));
    ASSERT_CU(cuEventRecord(e1, s1));
    ASSERT_CU(cuEventSynchronize(e1));
    EXPECT_NEAR(d, elapsed_ns(start, e1), kTol);

    // It shares the compute engine: after a kernel placed first on another
    // stream, it starts when the kernel ends.
    constexpr uint64_t kKernel = 10'000;
    gate({s1, s2});
    ASSERT_CU(cuEventRecord(start, s1));
    ASSERT_CU(launch(nop_kernel(kKernel), s1, nullptr));
    ASSERT_CU(cuMemcpyDtoDAsync_v2(b, a, kBytes, s2));
    ASSERT_CU(cuEventRecord(e1, s1));
    ASSERT_CU(cuEventRecord(e2, s2));
    ASSERT_CU(cuCtxSynchronize());
    EXPECT_NEAR(static_cast<double>(kKernel), elapsed_ns(start, e1), kTol);
    EXPECT_NEAR(static_cast<double>(kKernel) + d, elapsed_ns(start, e2), kTol);

    for (CUevent e : {start, e1, e2}) ASSERT_CU(cuEventDestroy_v2(e));
    ASSERT_CU(cuStreamDestroy_v2(s1));
    ASSERT_CU(cuStreamDestroy_v2(s2));
    ASSERT_CU(cuMemFree_v2(a));
    ASSERT_CU(cuMemFree_v2(b));
  });
}

TEST(SimClock, KernelElapsedTimeIsItsDeclaredDuration) {
  run_isolated({}, [] {
    init_primary();
    CUstream s = new_stream();
    CUevent start = timing_event(), mid = timing_event(), end = timing_event();
    for (uint64_t k : {uint64_t{1}, uint64_t{123'456}, uint64_t{7'000'000}}) {
      gate({s});
      ASSERT_CU(cuEventRecord(start, s));
      ASSERT_CU(launch(nop_kernel(k), s, nullptr));
      ASSERT_CU(cuEventRecord(mid, s));
      ASSERT_CU(launch(nop_kernel(2 * k), s, nullptr));
      ASSERT_CU(cuEventRecord(end, s));
      ASSERT_CU(cuEventSynchronize(end));
      EXPECT_NEAR(static_cast<double>(k), elapsed_ns(start, mid), kTol) << k;
      EXPECT_NEAR(static_cast<double>(3 * k), elapsed_ns(start, end), kTol) << k;
    }
    for (CUevent e : {start, mid, end}) ASSERT_CU(cuEventDestroy_v2(e));
    ASSERT_CU(cuStreamDestroy_v2(s));
  });
}

TEST(SimClock, HostWaitsMoveTheHostClockToTheWorkEnd) {
  run_isolated({}, [] {
    init_primary();
    CUstream s = new_stream();
    constexpr uint64_t kKernel = 5'000'000;
    CUfunction k = nop_kernel(kKernel);

    // cuStreamSynchronize: the launch costs 4000 ns, the kernel starts then.
    uint64_t t0 = simcuda_now_ns();
    ASSERT_CU(launch(k, s, nullptr));
    const uint64_t end = t0 + 4000 + kKernel;
    EXPECT_EQ(t0 + 4000, simcuda_now_ns()) << "a launch does not wait";
    EXPECT_EQ(end, simcuda_device_idle_at_ns(0));
    ASSERT_CU(cuStreamSynchronize(s));
    EXPECT_EQ(end, simcuda_now_ns());
    ASSERT_CU(cuStreamSynchronize(s));  // nothing left: only the call's cost
    EXPECT_EQ(end + 500, simcuda_now_ns());

    // cuEventSynchronize and cuCtxSynchronize likewise.
    CUevent ev = timing_event();
    t0 = simcuda_now_ns();
    ASSERT_CU(launch(k, s, nullptr));
    ASSERT_CU(cuEventRecord(ev, s));
    ASSERT_CU(cuEventSynchronize(ev));
    EXPECT_EQ(t0 + 4000 + kKernel, simcuda_now_ns());
    t0 = simcuda_now_ns();
    ASSERT_CU(launch(k, s, nullptr));
    ASSERT_CU(cuCtxSynchronize());
    EXPECT_EQ(t0 + 4000 + kKernel, simcuda_now_ns());

    ASSERT_CU(cuEventDestroy_v2(ev));
    ASSERT_CU(cuStreamDestroy_v2(s));
  });
}

TEST(SimClock, EachDriverCallCostsApiNsAndLaunchesLaunchNs) {
  run_isolated({{"SIMCUDA_API_NS", "1000"}, {"SIMCUDA_LAUNCH_NS", "7000"}}, [] {
    ASSERT_CU(cuInit(0));
    uint64_t t0 = simcuda_now_ns();
    for (int i = 0; i < 10; ++i) {
      int n = 0;
      ASSERT_CU(cuDeviceGetCount(&n));
    }
    EXPECT_EQ(t0 + 10 * 1000, simcuda_now_ns());
    EXPECT_EQ(t0 + 10 * 1000, simcuda_now_ns()) << "simcuda_now_ns itself is free";
    t0 = simcuda_now_ns();
    ASSERT_CU(cuInit(0));  // again: a call like any other
    EXPECT_EQ(t0 + 1000, simcuda_now_ns());

    init_primary();  // cuInit, retain, set current
    CUstream s = new_stream();
    CUfunction k = nop_kernel(1);
    t0 = simcuda_now_ns();
    ASSERT_CU(launch(k, s, nullptr));
    EXPECT_EQ(t0 + 7000, simcuda_now_ns());
    ASSERT_CU(cuStreamSynchronize(s));
    ASSERT_CU(cuStreamDestroy_v2(s));
  });
}

// Every driver call costs SIMCUDA_API_NS, the first cuInit included.
TEST(SimClock, FirstCuInitIsChargedLikeAnyCall) {
  run_isolated({{"SIMCUDA_API_NS", "1000"}}, [] {
    const uint64_t t0 = simcuda_now_ns();
    ASSERT_CU(cuInit(0));
    int n = 0;
    ASSERT_CU(cuDeviceGetCount(&n));
    EXPECT_EQ(t0 + 2 * 1000, simcuda_now_ns());
  });
}

TEST(SimClock, BusyPollingQueriesEventuallySucceedBecauseEachQueryAdvancesTheClock) {
  run_isolated({}, [] {
    init_primary();
    CUstream s = new_stream();
    CUevent start = timing_event(), end = timing_event();
    constexpr uint64_t kKernel = 100'000;
    CUfunction k = nop_kernel(kKernel);

    auto poll = [](auto query, uint64_t* not_ready) {
      *not_ready = 0;
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      for (;;) {
        CUresult r = query();
        if (r != CUDA_ERROR_NOT_READY) return r;
        ++*not_ready;
        if (std::chrono::steady_clock::now() > deadline) return r;  // hang guard
      }
    };

    ASSERT_CU(cuEventRecord(start, s));
    ASSERT_CU(launch(k, s, nullptr));
    ASSERT_CU(cuEventRecord(end, s));
    uint64_t not_ready = 0;
    EXPECT_CU(poll([&] { return cuEventQuery(end); }, &not_ready));
    // Each query costs 500 ns; the kernel ends 100 us after it was queued.
    EXPECT_GE(not_ready, kKernel / 500 - 10);
    EXPECT_NEAR(4000.0 + kKernel, elapsed_ns(start, end), kTol);

    // cuStreamQuery likewise.
    ASSERT_CU(launch(k, s, nullptr));
    EXPECT_CU(poll([&] { return cuStreamQuery(s); }, &not_ready));
    EXPECT_GE(not_ready, kKernel / 500 - 10);
    EXPECT_GE(simcuda_now_ns(), simcuda_device_idle_at_ns(0));

    ASSERT_CU(cuEventDestroy_v2(start));
    ASSERT_CU(cuEventDestroy_v2(end));
    ASSERT_CU(cuStreamDestroy_v2(s));
  });
}
