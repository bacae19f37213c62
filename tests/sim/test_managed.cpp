// Managed memory (docs/sim.md, "Managed memory"): cuMemAllocManaged,
// cuMemPrefetchAsync_v2, cuMemAdvise_v2, cuMemRangeGetAttribute and the
// kernel side (fault-driven migration, remote access, eviction). Residency is
// per granule (2 MiB by default); every expectation below follows from that
// model and the default link figures (55 GB/s prefetch, 20 GB/s fault-driven).
//
// Tests that read counters or the clock, or set SIMCUDA_*, run in a fresh
// process (run_isolated), so they pass alone (ctest) and all together.
#include <sys/mman.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "sim_test_extra.h"
#include "variants.h"

using namespace simtest;

namespace {

constexpr size_t kMiB = 1 << 20;

simcuda_memory_stats stats() {
  simcuda_memory_stats s{};
  simcuda_get_memory_stats(0, &s);
  return s;
}

CUmemLocation device_loc(int id = 0) {
  CUmemLocation l{};
  l.type = CU_MEM_LOCATION_TYPE_DEVICE;
  l.id = id;
  return l;
}

CUmemLocation host_loc() {
  CUmemLocation l{};
  l.type = CU_MEM_LOCATION_TYPE_HOST;
  return l;
}

CUstream new_stream() {
  CUstream s = nullptr;
  EXPECT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  return s;
}

CUevent timing_event() {
  CUevent e = nullptr;
  EXPECT_CU(cuEventCreate(&e, 0));
  return e;
}

// A kernel that adds 1 to each of `n` bytes at `p` (params: p, n): it touches
// the managed allocation `p` points into.
CUfunction inc_kernel(uint64_t duration_ns = 1000) {
  static const size_t sizes[] = {8, 8};
  simcuda_kernel_desc d{};
  d.name = "inc_kernel";
  d.fn = [](const void* params, size_t, const simcuda_launch_info*, void*) {
    unsigned char* p;
    size_t n;
    std::memcpy(&p, params, 8);
    std::memcpy(&n, static_cast<const char*>(params) + 8, 8);
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>(p[i] + 1);
  };
  d.param_sizes = sizes;
  d.num_params = 2;
  d.duration_ns = duration_ns;
  CUfunction f = nullptr;
  EXPECT_CU(simcuda_register_function(&d, &f));
  return f;
}

CUresult launch_inc(CUfunction f, CUstream s, CUdeviceptr p, size_t n) {
  void* params[] = {&p, &n};
  return launch(f, s, params);
}

// A kernel touching `p` (params: p) that does nothing with it.
CUfunction touch_kernel(uint64_t duration_ns = 1000) {
  static const size_t sizes[] = {8};
  simcuda_kernel_desc d{};
  d.name = "touch_kernel";
  d.fn = [](const void*, size_t, const simcuda_launch_info*, void*) {};
  d.param_sizes = sizes;
  d.num_params = 1;
  d.duration_ns = duration_ns;
  CUfunction f = nullptr;
  EXPECT_CU(simcuda_register_function(&d, &f));
  return f;
}

CUresult launch_touch(CUfunction f, CUstream s, CUdeviceptr p) {
  void* params[] = {&p};
  return launch(f, s, params);
}

CUdeviceptr managed(size_t n) {
  CUdeviceptr p = 0;
  EXPECT_CU(cuMemAllocManaged(&p, n, CU_MEM_ATTACH_GLOBAL));
  return p;
}

int last_prefetch(CUdeviceptr p, size_t n) {
  int v = -42;
  EXPECT_CU(cuMemRangeGetAttribute(&v, 4, CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, p, n));
  return v;
}

// Pages of [p, p + n) that exist in memory (host RAM really used).
size_t resident_pages(CUdeviceptr p, size_t n) {
  std::vector<unsigned char> v(n / 4096);
  EXPECT_EQ(0, mincore(reinterpret_cast<void*>(p), n, v.data()));
  size_t c = 0;
  for (unsigned char b : v) c += b & 1;
  return c;
}

uint64_t ceil_div(double bytes, double gbps) {
  return static_cast<uint64_t>(std::ceil(bytes / gbps));
}

}  // namespace

// cuda.h (cuMemAllocManaged): "If bytesize is 0, cuMemAllocManaged returns
// CUDA_ERROR_INVALID_VALUE"; "flags must be one of CU_MEM_ATTACH_GLOBAL or
// CU_MEM_ATTACH_HOST".
TEST(SimManaged, AllocRefusesBadFlagsAndSize) {
  init_primary();
  CUdeviceptr p = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAllocManaged(&p, 0, CU_MEM_ATTACH_GLOBAL));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAllocManaged(&p, 4096, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAllocManaged(&p, 4096, CU_MEM_ATTACH_SINGLE));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuMemAllocManaged(&p, 4096, CU_MEM_ATTACH_GLOBAL | CU_MEM_ATTACH_HOST));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAllocManaged(nullptr, 4096, CU_MEM_ATTACH_GLOBAL));
  EXPECT_EQ(0u, p);
  CUdeviceptr a = 0, b = 0;
  ASSERT_CU(cuMemAllocManaged(&a, 1000, CU_MEM_ATTACH_GLOBAL));
  ASSERT_CU(cuMemAllocManaged(&b, 1000, CU_MEM_ATTACH_HOST));
  EXPECT_NE(0u, a);
  EXPECT_NE(a, b);

  // cuPointerGetAttribute(IS_MANAGED): 1 for managed memory, 0 for other CUDA
  // memory, CUDA_ERROR_INVALID_VALUE for a pointer CUDA does not know.
  CUdeviceptr plain = 0;
  ASSERT_CU(cuMemAlloc_v2(&plain, 4096));
  unsigned int is = 7;
  ASSERT_CU(cuPointerGetAttribute(&is, CU_POINTER_ATTRIBUTE_IS_MANAGED, a + 10));
  EXPECT_EQ(1u, is);
  ASSERT_CU(cuPointerGetAttribute(&is, CU_POINTER_ATTRIBUTE_IS_MANAGED, plain));
  EXPECT_EQ(0u, is);
  int local = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuPointerGetAttribute(&is, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                                            reinterpret_cast<CUdeviceptr>(&local)));

  // cuMemFree takes the base pointer only, once.
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemFree_v2(a + 64));
  EXPECT_CU(cuMemFree_v2(a));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemFree_v2(a));
  ASSERT_CU(cuPointerGetAttribute(&is, CU_POINTER_ATTRIBUTE_IS_MANAGED, b));
  EXPECT_EQ(1u, is);
  EXPECT_CU(cuMemFree_v2(b));
  EXPECT_CU(cuMemFree_v2(plain));
}

// One address for the host and the device: what the host writes a kernel
// reads, what the kernel writes the host reads, and copies work both ways.
TEST(SimManaged, HostKernelAndCopiesSeeTheSameBytes) {
  init_primary();
  constexpr size_t n = 3 * kMiB + 100;
  CUdeviceptr p = managed(n);
  auto* h = reinterpret_cast<unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h[i] = static_cast<unsigned char>(i * 7);
  CUstream s = new_stream();
  ASSERT_CU(launch_inc(inc_kernel(), s, p, n));
  ASSERT_CU(cuStreamSynchronize(s));
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(static_cast<unsigned char>(i * 7 + 1), h[i]) << "byte " << i;

  std::vector<unsigned char> in(n, 0x3C), out(n, 0);
  ASSERT_CU(cuMemcpyHtoD_v2(p, in.data(), n));
  EXPECT_EQ(0x3C, h[n - 1]);
  ASSERT_CU(launch_inc(inc_kernel(), s, p, n));
  ASSERT_CU(cuStreamSynchronize(s));
  ASSERT_CU(cuMemcpyDtoH_v2(out.data(), p, n));
  EXPECT_EQ(std::vector<unsigned char>(n, 0x3D), out);
  CUdeviceptr q = managed(n);
  ASSERT_CU(cuMemcpyDtoD_v2(q, p, n));
  ASSERT_CU(cuMemsetD8_v2(p, 0x11, 16));
  EXPECT_EQ(0x3D, reinterpret_cast<unsigned char*>(q)[n - 1]);
  EXPECT_EQ(0x11, h[15]);
  EXPECT_CU(cuMemFree_v2(q));
  EXPECT_CU(cuMemFree_v2(p));
  EXPECT_CU(cuStreamDestroy_v2(s));
}

// First prefetch populates where asked, for free; later ones move only the
// granules not already there, each direction on its copy engine at link rate.
TEST(SimManaged, PrefetchMovesResidencyAndCostsLinkTime) {
  run_isolated({}, [] {
    init_primary();
    constexpr size_t n = 16 * kMiB;
    CUdeviceptr p = managed(n);
    CUstream s = new_stream();
    EXPECT_EQ(0u, simcuda_managed_device_bytes(p, n));
    EXPECT_EQ(CU_DEVICE_INVALID, last_prefetch(p, n));

    // Unpopulated -> device: "populated and mapped on the destination device".
    ASSERT_CU(cuMemPrefetchAsync_v2(p, n, device_loc(), 0, s));
    ASSERT_CU(cuStreamSynchronize(s));
    EXPECT_EQ(n, simcuda_managed_device_bytes(p, n));
    EXPECT_EQ(0u, stats().bytes_h2d);
    EXPECT_EQ(n, stats().device_used);
    EXPECT_EQ(0, last_prefetch(p, n));
    size_t free_b = 0, total = 0;
    ASSERT_CU(cuMemGetInfo_v2(&free_b, &total));
    EXPECT_EQ(total - n, free_b);

    // Device -> host: n bytes on the D2H engine.
    quiesce();
    uint64_t t0 = simcuda_now_ns();
    ASSERT_CU(cuMemPrefetchAsync_v2(p, n, host_loc(), 0, s));
    ASSERT_CU(cuStreamSynchronize(s));
    uint64_t dt = simcuda_now_ns() - t0;
    EXPECT_GE(dt, ceil_div(n, 55.0));
    EXPECT_LE(dt, ceil_div(n, 55.0) + 5000);
    EXPECT_EQ(n, stats().bytes_d2h);
    EXPECT_EQ(0u, simcuda_managed_device_bytes(p, n));
    EXPECT_EQ(0u, stats().device_used);
    EXPECT_EQ(CU_DEVICE_CPU, last_prefetch(p, n));

    // Host -> device for the first half only (a range inside granules
    // rounds out to whole granules: 1 byte past 8 MiB takes a 9th 2 MiB).
    quiesce();
    t0 = simcuda_now_ns();
    ASSERT_CU(cuMemPrefetchAsync_v2(p, 8 * kMiB + 1, device_loc(), 0, s));
    ASSERT_CU(cuStreamSynchronize(s));
    dt = simcuda_now_ns() - t0;
    EXPECT_GE(dt, ceil_div(10 * kMiB, 55.0));
    EXPECT_LE(dt, ceil_div(10 * kMiB, 55.0) + 5000);
    EXPECT_EQ(10 * kMiB, stats().bytes_h2d);
    EXPECT_EQ(10 * kMiB, simcuda_managed_device_bytes(p, n));
    EXPECT_EQ(10 * kMiB, stats().device_used);
    EXPECT_EQ(CU_DEVICE_INVALID, last_prefetch(p, n)) << "halves prefetched to different places";
    CUmemLocationType t = CU_MEM_LOCATION_TYPE_INVALID;
    ASSERT_CU(cuMemRangeGetAttribute(&t, sizeof t,
                                     CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE, p, kMiB));
    EXPECT_EQ(CU_MEM_LOCATION_TYPE_DEVICE, t);

    // Again: nothing left to move, no link time.
    quiesce();
    t0 = simcuda_now_ns();
    ASSERT_CU(cuMemPrefetchAsync_v2(p, 8 * kMiB, device_loc(), 0, s));
    ASSERT_CU(cuStreamSynchronize(s));
    EXPECT_LT(simcuda_now_ns() - t0, 5000u);
    EXPECT_EQ(10 * kMiB, stats().bytes_h2d);

    // The per-thread form takes the same arguments.
    ASSERT_CU(cuMemPrefetchAsync_v2_ptsz(p, n, host_loc(), 0, nullptr));
    ASSERT_CU(cuCtxSynchronize());
    EXPECT_EQ(0u, simcuda_managed_device_bytes(p, n));
    EXPECT_CU(cuMemFree_v2(p));
  });
}

// A kernel touching host-resident managed memory migrates it first (page
// faults, at the fault rate), counted in managed_fault_bytes and bytes_h2d.
TEST(SimManaged, KernelMigratesHostResidentMemoryOnFault) {
  run_isolated({}, [] {
    init_primary();
    constexpr size_t n = 4 * kMiB;
    CUdeviceptr p = managed(n);
    std::memset(reinterpret_cast<void*>(p), 1, n);  // the CPU's first touch: on the host
    CUstream s = new_stream();
    CUevent a = timing_event(), b = timing_event();
    CUfunction k = inc_kernel(1000);
    gate({s});
    ASSERT_CU(cuEventRecord(a, s));
    ASSERT_CU(launch_inc(k, s, p, n));
    ASSERT_CU(cuEventRecord(b, s));
    ASSERT_CU(cuStreamSynchronize(s));
    EXPECT_EQ(n, stats().managed_fault_bytes);
    EXPECT_EQ(n, stats().bytes_h2d);
    EXPECT_EQ(n, simcuda_managed_device_bytes(p, n));
    EXPECT_EQ(n, stats().device_used);
    EXPECT_EQ(0u, stats().remote_access_bytes);
    // The kernel's 1 us plus 4 MiB at the 20 GB/s fault rate (slower than the
    // 55 GB/s a prefetch gets).
    EXPECT_NEAR(1000.0 + static_cast<double>(ceil_div(n, 20.0)), elapsed_ns(a, b), 3.0);
    EXPECT_EQ(2, reinterpret_cast<unsigned char*>(p)[n - 1]);

    // Resident now: the next kernel migrates nothing and takes 1 us.
    gate({s});
    ASSERT_CU(cuEventRecord(a, s));
    ASSERT_CU(launch_inc(k, s, p, n));
    ASSERT_CU(cuEventRecord(b, s));
    ASSERT_CU(cuStreamSynchronize(s));
    EXPECT_EQ(n, stats().managed_fault_bytes);
    EXPECT_NEAR(1000.0, elapsed_ns(a, b), 3.0);

    // Memory nobody touched yet is populated on the device by the kernel's
    // first touch: nothing crosses the link.
    CUdeviceptr fresh = managed(n);
    ASSERT_CU(launch_touch(touch_kernel(), s, fresh));
    ASSERT_CU(cuStreamSynchronize(s));
    EXPECT_EQ(n, simcuda_managed_device_bytes(fresh, n));
    EXPECT_EQ(n, stats().managed_fault_bytes);
    EXPECT_EQ(2 * n, stats().device_used);
    EXPECT_CU(cuMemFree_v2(fresh));
    EXPECT_CU(cuMemFree_v2(p));
  });
}

// Preferred location host + ACCESSED_BY the device: kernels read the data in
// place over the link, nothing migrates. Without ACCESSED_BY it migrates.
TEST(SimManaged, AccessedByWithHostPreferenceIsReadRemotely) {
  run_isolated({}, [] {
    init_primary();
    constexpr size_t n = 4 * kMiB;
    CUdeviceptr p = managed(n);
    std::memset(reinterpret_cast<void*>(p), 5, n);
    ASSERT_CU(cuMemAdvise_v2(p, n, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, host_loc()));
    ASSERT_CU(cuMemAdvise_v2(p, n, CU_MEM_ADVISE_SET_ACCESSED_BY, device_loc()));
    int pref = -42;
    ASSERT_CU(cuMemRangeGetAttribute(&pref, 4, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, p, n));
    EXPECT_EQ(CU_DEVICE_CPU, pref);
    int by[3] = {-42, -42, -42};
    ASSERT_CU(cuMemRangeGetAttribute(by, sizeof by, CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY, p, n));
    EXPECT_EQ(0, by[0]);
    EXPECT_EQ(CU_DEVICE_INVALID, by[1]);
    EXPECT_EQ(CU_DEVICE_INVALID, by[2]);

    CUstream s = new_stream();
    CUevent a = timing_event(), b = timing_event();
    CUfunction k = inc_kernel(1000);
    gate({s});
    ASSERT_CU(cuEventRecord(a, s));
    ASSERT_CU(launch_inc(k, s, p, n));
    ASSERT_CU(cuEventRecord(b, s));
    ASSERT_CU(cuStreamSynchronize(s));
    EXPECT_EQ(n, stats().remote_access_bytes);
    EXPECT_EQ(0u, stats().managed_fault_bytes);
    EXPECT_EQ(0u, stats().bytes_h2d);
    EXPECT_EQ(0u, simcuda_managed_device_bytes(p, n));
    EXPECT_EQ(0u, stats().device_used);
    EXPECT_NEAR(1000.0 + static_cast<double>(static_cast<uint64_t>(n / 55.0)), elapsed_ns(a, b),
                3.0);
    EXPECT_EQ(6, reinterpret_cast<unsigned char*>(p)[0]);

    // Without the mapping the device faults and migrates it.
    ASSERT_CU(cuMemAdvise_v2(p, n, CU_MEM_ADVISE_UNSET_ACCESSED_BY, device_loc()));
    ASSERT_CU(launch_inc(k, s, p, n));
    ASSERT_CU(cuStreamSynchronize(s));
    EXPECT_EQ(n, stats().remote_access_bytes);
    EXPECT_EQ(n, stats().managed_fault_bytes);
    EXPECT_EQ(n, simcuda_managed_device_bytes(p, n));
    EXPECT_CU(cuMemFree_v2(p));
  });
}

// More managed memory than the device holds: each migration evicts the least
// recently used granules of other managed allocations to the host, and the
// device's used memory never exceeds its capacity.
TEST(SimManaged, OversubscriptionEvictsLeastRecentlyUsed) {
  run_isolated({{"SIMCUDA_DEVICE_MEMORY", "64MiB"}}, [] {
    init_primary();
    constexpr size_t n = 24 * kMiB, cap = 64 * kMiB;
    CUstream s = new_stream();
    CUdeviceptr a = managed(n), b = managed(n), c = managed(n);
    std::memset(reinterpret_cast<void*>(c), 9, n);  // on the host: costs link time to move
    ASSERT_CU(cuMemPrefetchAsync_v2(a, n, device_loc(), 0, s));
    ASSERT_CU(cuMemPrefetchAsync_v2(b, n, device_loc(), 0, s));
    // A kernel uses a: b is now the least recently used.
    ASSERT_CU(launch_touch(touch_kernel(), s, a));
    ASSERT_CU(cuMemPrefetchAsync_v2(c, n, device_loc(), 0, s));
    ASSERT_CU(cuStreamSynchronize(s));
    EXPECT_EQ(n, simcuda_managed_device_bytes(a, n));
    EXPECT_EQ(n, simcuda_managed_device_bytes(c, n));
    // 8 MiB of b went: its oldest granules, the first four.
    EXPECT_EQ(16 * kMiB, simcuda_managed_device_bytes(b, n));
    EXPECT_EQ(0u, simcuda_managed_device_bytes(b, 8 * kMiB));
    EXPECT_EQ(8 * kMiB, stats().bytes_d2h);
    EXPECT_EQ(n, stats().bytes_h2d);
    EXPECT_EQ(cap, stats().device_used);
    EXPECT_LE(stats().device_peak, cap);

    // cuMemAlloc does not evict managed memory (stricter than the driver
    // needs to be): the device is full.
    CUdeviceptr plain = 0;
    EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, cuMemAlloc_v2(&plain, 2 * kMiB));

    // One allocation larger than the device: a prefetch keeps what it brings
    // in, evicts everything else and leaves the rest on the host.
    constexpr size_t big = 80 * kMiB;
    CUdeviceptr d = managed(big);
    ASSERT_CU(cuMemPrefetchAsync_v2(d, big, device_loc(), 0, s));
    ASSERT_CU(cuStreamSynchronize(s));
    EXPECT_EQ(cap, simcuda_managed_device_bytes(d, big));
    EXPECT_EQ(0u, simcuda_managed_device_bytes(a, n) + simcuda_managed_device_bytes(b, n) +
                      simcuda_managed_device_bytes(c, n));
    EXPECT_EQ(cap, stats().device_used);
    EXPECT_LE(stats().device_peak, cap);

    // A kernel touching all of it does not fail: what does not fit is read
    // remotely. Touching a then evicts part of d, never a granule of a itself.
    ASSERT_CU(launch_touch(touch_kernel(), s, d));
    ASSERT_CU(cuStreamSynchronize(s));
    EXPECT_EQ(big - cap, stats().remote_access_bytes);
    ASSERT_CU(launch_touch(touch_kernel(), s, a));
    ASSERT_CU(cuStreamSynchronize(s));
    EXPECT_EQ(n, simcuda_managed_device_bytes(a, n));
    EXPECT_EQ(cap - n, simcuda_managed_device_bytes(d, big));
    EXPECT_LE(stats().device_peak, cap);
    char why[256] = "";
    EXPECT_EQ(CUDA_SUCCESS, simcuda_sticky_error(0, why, sizeof why)) << why;
  });
}

// cuda.h (cuMemPrefetchAsync, cuMemAdvise): the range must be managed memory,
// flags must be zero, the location a valid one for the call.
TEST(SimManaged, PrefetchAndAdviseRefuseBadArguments) {
  init_primary();
  CUstream s = new_stream();
  CUdeviceptr p = managed(4 * kMiB), plain = 0;
  ASSERT_CU(cuMemAlloc_v2(&plain, 4096));
  int local[1024] = {};
  auto host_ptr = reinterpret_cast<CUdeviceptr>(local);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemPrefetchAsync_v2(plain, 4096, device_loc(), 0, s));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemPrefetchAsync_v2(host_ptr, 4096, device_loc(), 0, s));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemPrefetchAsync_v2(p, 4096, device_loc(), 1, s));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemPrefetchAsync_v2(p, 0, device_loc(), 0, s));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuMemPrefetchAsync_v2(p, 4 * kMiB + 1, device_loc(), 0, s));  // past its end
  EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE, cuMemPrefetchAsync_v2(p, 4096, device_loc(3), 0, s));
  EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE, cuMemPrefetchAsync_v2(p, 4096, device_loc(-1), 0, s));
  CUmemLocation bad{};
  bad.type = CU_MEM_LOCATION_TYPE_INVALID;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemPrefetchAsync_v2(p, 4096, bad, 0, s));
  CUmemLocation numa{};
  numa.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  numa.id = 1;  // the simulated host has node 0 only
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemPrefetchAsync_v2(p, 4096, numa, 0, s));
  numa.id = 0;
  EXPECT_CU(cuMemPrefetchAsync_v2(p, 4096, numa, 0, s));
  CUmemLocation current{};
  current.type = CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
  current.id = 1234;  // ignored (cuda.h)
  EXPECT_CU(cuMemPrefetchAsync_v2(p, 4096, current, 0, s));
  CUstream gone = new_stream();
  ASSERT_CU(cuStreamDestroy_v2(gone));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, cuMemPrefetchAsync_v2(p, 4096, device_loc(), 0, gone));

  // 0 and 7 are no advice (and inside the enum's range: no UB in the test).
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuMemAdvise_v2(p, 4096, static_cast<CUmem_advise>(0), device_loc()));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuMemAdvise_v2(p, 4096, static_cast<CUmem_advise>(7), device_loc()));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuMemAdvise_v2(plain, 4096, CU_MEM_ADVISE_SET_READ_MOSTLY, device_loc()));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuMemAdvise_v2(host_ptr, 4096, CU_MEM_ADVISE_SET_READ_MOSTLY, device_loc()));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuMemAdvise_v2(p, 4096, CU_MEM_ADVISE_SET_ACCESSED_BY, numa));  // DEVICE or HOST only
  EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE,
            cuMemAdvise_v2(p, 4096, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, device_loc(2)));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuMemAdvise_v2(p, 4096, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, bad));
  // The location is ignored for READ_MOSTLY.
  EXPECT_CU(cuMemAdvise_v2(p, 4096, CU_MEM_ADVISE_SET_READ_MOSTLY, bad));
  int rm = -1;
  ASSERT_CU(cuMemRangeGetAttribute(&rm, 4, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, p, 4096));
  EXPECT_EQ(1, rm);
  ASSERT_CU(cuMemRangeGetAttribute(&rm, 4, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, p, 4 * kMiB));
  EXPECT_EQ(0, rm) << "the second granule is not read-mostly";
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuMemRangeGetAttribute(&rm, 8, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, p, 4096));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuMemRangeGetAttribute(&rm, 4, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, plain, 4096));

  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_CU(cuMemFree_v2(p));
  EXPECT_CU(cuMemFree_v2(plain));
  EXPECT_CU(cuStreamDestroy_v2(s));
}

// A prefetch is an op of its stream: queued behind a long kernel, it runs
// after it; on another stream it does not wait.
TEST(SimManaged, PrefetchIsStreamOrdered) {
  run_isolated({}, [] {
    init_primary();
    constexpr size_t n = 16 * kMiB;
    constexpr uint64_t kLong = 5'000'000;
    CUdeviceptr p = managed(n), q = managed(n);
    std::memset(reinterpret_cast<void*>(p), 1, n);
    std::memset(reinterpret_cast<void*>(q), 1, n);
    CUstream s = new_stream(), other = new_stream();
    CUevent a = timing_event(), b = timing_event(), c = timing_event(), d = timing_event();
    gate({s, other});
    ASSERT_CU(cuEventRecord(a, s));
    ASSERT_CU(cuEventRecord(c, other));
    // The other stream's prefetch first: both share the H2D engine.
    ASSERT_CU(cuMemPrefetchAsync_v2(q, n, device_loc(), 0, other));
    ASSERT_CU(cuEventRecord(d, other));
    ASSERT_CU(launch(nop_kernel(kLong), s, nullptr));
    ASSERT_CU(cuMemPrefetchAsync_v2(p, n, device_loc(), 0, s));
    ASSERT_CU(cuEventRecord(b, s));
    ASSERT_CU(cuCtxSynchronize());
    const double one = static_cast<double>(ceil_div(n, 55.0));
    // Behind the kernel: the kernel's time plus its own; the other stream's
    // prefetch did not wait for the kernel.
    EXPECT_NEAR(static_cast<double>(kLong) + one, elapsed_ns(a, b), 3.0);
    EXPECT_NEAR(one, elapsed_ns(c, d), 3.0);
  });
}

// cuMemFree of managed memory waits for work using it and returns its device
// memory.
TEST(SimManaged, FreeReleasesDeviceAccounting) {
  run_isolated({}, [] {
    init_primary();
    constexpr size_t n = 8 * kMiB;
    CUdeviceptr p = managed(n);
    std::memset(reinterpret_cast<void*>(p), 1, n);
    CUstream s = new_stream();
    ASSERT_CU(cuMemPrefetchAsync_v2(p, n, device_loc(), 0, s));
    EXPECT_EQ(n, stats().device_used);
    // A kernel using p that blocks (for real) until the gate opens: the free
    // must not return before it has run.
    static Gate gate_open;
    static const size_t sizes[] = {8};
    simcuda_kernel_desc d{};
    d.name = "gated_writer";
    d.fn = [](const void* params, size_t, const simcuda_launch_info*, void*) {
      unsigned char* q;
      std::memcpy(&q, params, 8);
      gate_open.wait();
      q[0] = 42;
    };
    d.param_sizes = sizes;
    d.num_params = 1;
    CUfunction k = nullptr;
    ASSERT_CU(simcuda_register_function(&d, &k));
    ASSERT_CU(launch_touch(k, s, p));
    std::thread opener([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      gate_open.open = true;
    });
    ASSERT_CU(cuMemFree_v2(p));
    EXPECT_TRUE(gate_open.open.load()) << "cuMemFree returned while a kernel used the memory";
    opener.join();
    EXPECT_CU(cuStreamSynchronize(s));
    EXPECT_EQ(0u, stats().device_used);
    EXPECT_EQ(0u, simcuda_managed_device_bytes(p, n));
    size_t free_b = 0, total = 0;
    ASSERT_CU(cuMemGetInfo_v2(&free_b, &total));
    EXPECT_EQ(total, free_b);
    unsigned int is = 0;
    EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
              cuPointerGetAttribute(&is, CU_POINTER_ATTRIBUTE_IS_MANAGED, p));
  });
}

// cuda.h (cuMemPrefetchAsync): a DEVICE destination "must have non-zero value
// for the device attribute CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS".
TEST(SimManaged, NoConcurrentManagedAccessRefusesDevicePrefetch) {
  run_isolated({{"SIMCUDA_CONCURRENT_MANAGED", "0"}}, [] {
    init_primary();
    int v = -1;
    ASSERT_CU(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 0));
    EXPECT_EQ(0, v);
    CUdeviceptr p = managed(4 * kMiB);
    CUstream s = new_stream();
    EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE, cuMemPrefetchAsync_v2(p, 4096, device_loc(), 0, s));
    EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE,
              cuMemAdvise_v2(p, 4096, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, device_loc()));
    EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE,
              cuMemAdvise_v2(p, 4096, CU_MEM_ADVISE_SET_ACCESSED_BY, device_loc()));
    EXPECT_CU(cuMemPrefetchAsync_v2(p, 4096, host_loc(), 0, s));
    EXPECT_CU(cuStreamSynchronize(s));
    EXPECT_EQ(0u, simcuda_managed_device_bytes(p, 4 * kMiB));
    EXPECT_CU(cuMemFree_v2(p));
  });
}

// SIMCUDA_FAIL works by name for the managed entry points (base names too).
TEST(SimManaged, FaultInjection) {
  run_isolated({{"SIMCUDA_FAIL", "cuMemAllocManaged:1,cuMemPrefetchAsync:1,cuMemAdvise:1"}}, [] {
    init_primary();
    CUdeviceptr p = 0;
    EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, cuMemAllocManaged(&p, 4096, CU_MEM_ATTACH_GLOBAL));
    ASSERT_CU(cuMemAllocManaged(&p, 4096, CU_MEM_ATTACH_GLOBAL));
    CUstream s = new_stream();
    EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemPrefetchAsync_v2(p, 4096, device_loc(), 0, s));
    ASSERT_CU(cuStreamSynchronize(s));
    EXPECT_EQ(0u, simcuda_managed_device_bytes(p, 4096)) << "a failed call did something";
    EXPECT_CU(cuMemPrefetchAsync_v2(p, 4096, device_loc(), 0, s));
    ASSERT_CU(cuStreamSynchronize(s));
    EXPECT_EQ(4096u, simcuda_managed_device_bytes(p, 4096));
    EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
              cuMemAdvise_v2(p, 4096, CU_MEM_ADVISE_SET_READ_MOSTLY, device_loc()));
    EXPECT_CU(cuMemAdvise_v2(p, 4096, CU_MEM_ADVISE_SET_READ_MOSTLY, device_loc()));
    EXPECT_EQ(2u, simcuda_call_count("cuMemPrefetchAsync"));
    EXPECT_EQ(2u, simcuda_call_count("cuMemAdvise_v2"));
    EXPECT_CU(cuMemFree_v2(p));
  });
}

// SIMCUDA_DATA=0: migrations are counted and timed but read or write no byte,
// so a large managed allocation costs no host RAM.
TEST(SimManaged, AccountingModeMigrationsTouchNoByte) {
  run_isolated({{"SIMCUDA_DATA", "0"}}, [] {
    init_primary();
    constexpr size_t n = 64 * kMiB;
    CUdeviceptr p = managed(n);
    CUstream s = new_stream();
    ASSERT_CU(cuMemPrefetchAsync_v2(p, n, host_loc(), 0, s));
    ASSERT_CU(cuMemPrefetchAsync_v2(p, n, device_loc(), 0, s));
    ASSERT_CU(cuMemPrefetchAsync_v2(p, n, host_loc(), 0, s));
    ASSERT_CU(launch_touch(touch_kernel(), s, p));
    ASSERT_CU(cuStreamSynchronize(s));
    EXPECT_EQ(n, simcuda_managed_device_bytes(p, n));
    EXPECT_EQ(n, stats().bytes_d2h);
    EXPECT_EQ(n, stats().managed_fault_bytes);
    EXPECT_EQ(0u, resident_pages(p, n));
    EXPECT_CU(cuMemFree_v2(p));
  });
}

// cuGetProcAddress_v2 finds the CUDA 13 forms under their base names.
TEST(SimManaged, ProcAddress) {
  ASSERT_CU(cuInit(0));
  void* fn = nullptr;
  CUdriverProcAddressQueryResult st{};
  ASSERT_CU(cuGetProcAddress_v2("cuMemPrefetchAsync", &fn, 13000, 0, &st));
  EXPECT_EQ(reinterpret_cast<void*>(&cuMemPrefetchAsync_v2), fn);
  ASSERT_CU(cuGetProcAddress_v2("cuMemPrefetchAsync", &fn, 13000,
                                CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st));
  EXPECT_EQ(reinterpret_cast<void*>(&cuMemPrefetchAsync_v2_ptsz), fn);
  ASSERT_CU(cuGetProcAddress_v2("cuMemAdvise", &fn, 13000, 0, &st));
  EXPECT_EQ(reinterpret_cast<void*>(&cuMemAdvise_v2), fn);
  ASSERT_CU(cuGetProcAddress_v2("cuMemAllocManaged", &fn, 13000, 0, &st));
  EXPECT_EQ(reinterpret_cast<void*>(&cuMemAllocManaged), fn);
  // The v1 forms (CUdevice arguments) are not simulated.
  ASSERT_CU(cuGetProcAddress_v2("cuMemPrefetchAsync", &fn, 12000, 0, &st));
  EXPECT_EQ(nullptr, fn);
  EXPECT_EQ(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, st);
}
