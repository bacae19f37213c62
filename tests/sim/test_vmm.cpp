// VMM and memory strictness of the simulated driver. Each test cites the
// cuda.h (CUDA 13.0) text it follows. The SimVmmOwnProcess tests set
// SIMCUDA_* before cuInit or leave the context with a sticky error, so they
// need a process of their own: ctest gives every test one
// (gtest_discover_tests); run directly, they skip unless selected alone with
// --gtest_filter=SimVmmOwnProcess.Name.
#include <sys/mman.h>

#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "sim_test_util.h"

using namespace simtest;

namespace {

constexpr size_t kMiB = size_t{1} << 20;

#define REQUIRE_OWN_PROCESS()                                                         \
  do {                                                                                \
    if (::testing::UnitTest::GetInstance()->test_to_run_count() != 1)                 \
      GTEST_SKIP() << "needs a process of its own: run it alone with --gtest_filter " \
                      "(ctest does)";                                                 \
  } while (0)

std::vector<unsigned char> pattern(size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<unsigned char>((i * 131 + seed * 7 + i / 4096) & 0xff);
  return v;
}

CUresult grant(CUdeviceptr ptr, size_t size) {
  CUmemAccessDesc acc{};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = 0;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return cuMemSetAccess(ptr, size, &acc, 1);
}

simcuda_memory_stats stats() {
  simcuda_memory_stats s{};
  simcuda_get_memory_stats(0, &s);
  return s;
}

void* P(CUdeviceptr p) {
  return reinterpret_cast<void*>(p);
}
CUdeviceptr D(const void* p) {
  return reinterpret_cast<CUdeviceptr>(p);
}

// Launches copy_kernel(dst, src, n) on `s`.
CUresult launch_copy(CUfunction k, CUstream s, CUdeviceptr dst, CUdeviceptr src, size_t n) {
  void* d = P(dst);
  void* sp = P(src);
  void* params[] = {&d, &sp, &n};
  return launch(k, s, params);
}

// Launches sleep_kernel for `real_us` of real time on `s`.
CUresult launch_sleep(CUfunction k, CUstream s, uint64_t real_us) {
  void* params[] = {&real_us};
  return launch(k, s, params);
}

// The faulting address in simcuda_sticky_error's description
// ("illegal address 0x... in kernel ...").
uintptr_t fault_address(const std::string& what) {
  size_t at = what.find("0x");
  if (at == std::string::npos) return 0;
  return static_cast<uintptr_t>(std::strtoull(what.c_str() + at, nullptr, 16));
}

}  // namespace

// ---- reserve / create / map / set access / unmap / release / free ----------

// cuda.h cuMemMap: "Maps bytes of memory represented by handle ... to address
// range [addr, addr + size]"; "calling cuMemMap does not make the address
// accessible ... cuMemSetAccess". cuMemUnmap: "the address range is converted
// to an address reservation and can be used for a future calls to cuMemMap".
// cuMemRelease: memory is freed "when all outstanding mappings ... are unmapped
// and ... the handle [is] released", so data survives an unmap while the
// handle lives.
TEST(SimVmm, HappyPathDataSurvivesRemap) {
  init_primary();
  const size_t g = granularity();
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 2 * g, 0, 0, 0));
  EXPECT_EQ(0u, va % g) << "default alignment is the granularity";
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp prop = device_prop();
  ASSERT_CU(cuMemCreate(&h, g, &prop, 0));
  CUmemAllocationProp got{};
  ASSERT_CU(cuMemGetAllocationPropertiesFromHandle(&got, h));
  EXPECT_EQ(CU_MEM_LOCATION_TYPE_DEVICE, got.location.type);
  ASSERT_CU(cuMemMap(va, g, 0, h, 0));
  CUmemLocation loc{CU_MEM_LOCATION_TYPE_DEVICE, 0};
  unsigned long long flags = 99;
  ASSERT_CU(cuMemGetAccess(&flags, &loc, va));
  EXPECT_EQ(CU_MEM_ACCESS_FLAGS_PROT_NONE, flags) << "mappings start with no access";
  ASSERT_CU(grant(va, g));
  ASSERT_CU(cuMemGetAccess(&flags, &loc, va));
  EXPECT_EQ(CU_MEM_ACCESS_FLAGS_PROT_READWRITE, flags);

  auto data = pattern(g, 1);
  ASSERT_CU(cuMemcpyHtoD_v2(va, data.data(), g));
  std::vector<unsigned char> back(g);
  ASSERT_CU(cuMemcpyDtoH_v2(back.data(), va, g));
  EXPECT_EQ(data, back);

  // Unmap, map the same handle at the second granule: same bytes.
  ASSERT_CU(cuMemUnmap(va, g));
  ASSERT_CU(cuMemMap(va + g, g, 0, h, 0));
  ASSERT_CU(grant(va + g, g));
  std::fill(back.begin(), back.end(), 0);
  ASSERT_CU(cuMemcpyDtoH_v2(back.data(), va + g, g));
  EXPECT_EQ(data, back);

  EXPECT_CU(cuMemUnmap(va + g, g));
  EXPECT_CU(cuMemRelease(h));
  EXPECT_CU(cuMemAddressFree(va, 2 * g));
}

// simcuda_mapping_signature (a sim extension, simcuda.h): changes with every
// map, unmap and access change on the range, even a remap of the same handle
// or an access change undone, and with nothing done next to the range.
TEST(SimVmm, MappingSignatureChangesWithEveryChangeToTheRangeOnly) {
  init_primary();
  const size_t g = granularity();
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 3 * g, 0, 0, 0));
  CUmemGenericAllocationHandle h = 0, other = 0;
  CUmemAllocationProp prop = device_prop();
  ASSERT_CU(cuMemCreate(&h, g, &prop, 0));
  ASSERT_CU(cuMemCreate(&other, g, &prop, 0));
  auto sig = [&] { return simcuda_mapping_signature(va + g, g); };
  const uint64_t empty = sig();
  EXPECT_EQ(empty, sig()) << "a reading is stable";
  ASSERT_CU(cuMemMap(va + g, g, 0, h, 0));
  const uint64_t mapped = sig();
  EXPECT_NE(empty, mapped);
  ASSERT_CU(grant(va + g, g));
  const uint64_t granted = sig();
  EXPECT_NE(mapped, granted);
  // Neighbours on both sides: mapped, opened, unmapped. The range's reading
  // does not move.
  ASSERT_CU(cuMemMap(va, g, 0, other, 0));
  ASSERT_CU(grant(va, g));
  ASSERT_CU(cuMemUnmap(va, g));
  ASSERT_CU(cuMemMap(va + 2 * g, g, 0, other, 0));
  ASSERT_CU(cuMemUnmap(va + 2 * g, g));
  EXPECT_EQ(granted, sig());
  // A reading of a range that spans a neighbour does move with it.
  const uint64_t wide = simcuda_mapping_signature(va, 2 * g);
  ASSERT_CU(cuMemMap(va, g, 0, other, 0));
  EXPECT_NE(wide, simcuda_mapping_signature(va, 2 * g));
  ASSERT_CU(cuMemUnmap(va, g));
  // The same handle unmapped and mapped again, with the same access: a change.
  ASSERT_CU(cuMemUnmap(va + g, g));
  ASSERT_CU(cuMemMap(va + g, g, 0, h, 0));
  ASSERT_CU(grant(va + g, g));
  const uint64_t remapped = sig();
  EXPECT_NE(granted, remapped);
  // The same access granted again: a change too (the mapping was touched).
  ASSERT_CU(grant(va + g, g));
  EXPECT_NE(remapped, sig());
  EXPECT_CU(cuMemUnmap(va + g, g));
  EXPECT_EQ(empty, sig()) << "unmapped again: as before any mapping";
  EXPECT_CU(cuMemRelease(h));
  EXPECT_CU(cuMemRelease(other));
  EXPECT_CU(cuMemAddressFree(va, 3 * g));
}

// cuda.h cuMemMap: "cuMemMap can only create mappings on VA range reservations
// that are not currently mapped."
TEST(SimVmm, MapOverExistingMappingIsInvalidValue) {
  init_primary();
  const size_t g = granularity();
  CUmemAllocationProp prop = device_prop();
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 3 * g, 0, 0, 0));
  CUmemGenericAllocationHandle h1 = 0, h2 = 0;
  ASSERT_CU(cuMemCreate(&h1, g, &prop, 0));
  ASSERT_CU(cuMemCreate(&h2, 2 * g, &prop, 0));
  ASSERT_CU(cuMemMap(va + g, g, 0, h1, 0));
  // Same start, same size.
  CUmemGenericAllocationHandle h4 = 0;
  ASSERT_CU(cuMemCreate(&h4, g, &prop, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemMap(va + g, g, 0, h4, 0));
  EXPECT_CU(cuMemRelease(h4));
  // Starts before the mapping and runs into it.
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemMap(va, 2 * g, 0, h2, 0));
  // Starts inside... the mapping is one granule, so: starts at it, runs past.
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemMap(va + g, 2 * g, 0, h2, 0));
  // The free granule before it is fine.
  CUmemGenericAllocationHandle h3 = 0;
  ASSERT_CU(cuMemCreate(&h3, g, &prop, 0));
  EXPECT_CU(cuMemMap(va, g, 0, h3, 0));
  EXPECT_CU(cuMemUnmap(va, g));
  EXPECT_CU(cuMemUnmap(va + g, g));
  EXPECT_CU(cuMemRelease(h1));
  EXPECT_CU(cuMemRelease(h2));
  EXPECT_CU(cuMemRelease(h3));
  EXPECT_CU(cuMemAddressFree(va, 3 * g));
}

// cuda.h cuMemUnmap: "The range must be the entire contiguous address range
// that was mapped to. In other words, cuMemUnmap cannot unmap a sub-range of
// an address range mapped by cuMemCreate / cuMemMap."
TEST(SimVmm, PartialUnmapIsInvalidValue) {
  init_primary();
  const size_t g = granularity();
  CUmemAllocationProp prop = device_prop();
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 3 * g, 0, 0, 0));
  CUmemGenericAllocationHandle a = 0, b = 0;
  ASSERT_CU(cuMemCreate(&a, g, &prop, 0));
  ASSERT_CU(cuMemCreate(&b, 2 * g, &prop, 0));
  ASSERT_CU(cuMemMap(va, g, 0, a, 0));          // A = [va, va+g)
  ASSERT_CU(cuMemMap(va + g, 2 * g, 0, b, 0));  // B = [va+g, va+3g)
  ASSERT_CU(grant(va, g));
  ASSERT_CU(grant(va + g, 2 * g));
  auto data = pattern(2 * g, 2);
  ASSERT_CU(cuMemcpyHtoD_v2(va + g, data.data(), 2 * g));

  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(va + g, g)) << "first half of B";
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(va + 2 * g, g)) << "second half of B";
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(va, 2 * g)) << "all of A, ends inside B";

  // Nothing was unmapped by the refused calls: B still reads back.
  std::vector<unsigned char> back(2 * g);
  ASSERT_CU(cuMemcpyDtoH_v2(back.data(), va + g, 2 * g));
  EXPECT_EQ(data, back);
  CUmemLocation loc{CU_MEM_LOCATION_TYPE_DEVICE, 0};
  unsigned long long flags = 0;
  EXPECT_CU(cuMemGetAccess(&flags, &loc, va));
  EXPECT_EQ(CU_MEM_ACCESS_FLAGS_PROT_READWRITE, flags);

  EXPECT_CU(cuMemUnmap(va, g));
  EXPECT_CU(cuMemUnmap(va + g, 2 * g));
  EXPECT_CU(cuMemRelease(a));
  EXPECT_CU(cuMemRelease(b));
  EXPECT_CU(cuMemAddressFree(va, 3 * g));
}

// cuda.h cuMemCreate: "The size of this allocation must be a multiple of the
// the value given via cuMemGetAllocationGranularity with the
// CU_MEM_ALLOC_GRANULARITY_MINIMUM flag." cuMemMap: "Both ptr, size, and
// offset must be a multiple of the value given via
// cuMemGetAllocationGranularity with the CU_MEM_ALLOC_GRANULARITY_MINIMUM flag."
TEST(SimVmm, UnalignedCreateAndMapAreInvalidValue) {
  init_primary();
  const size_t g = granularity();
  size_t gmin = 0;
  CUmemAllocationProp prop = device_prop();
  ASSERT_CU(cuMemGetAllocationGranularity(&gmin, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  ASSERT_EQ(g, gmin);
  CUmemGenericAllocationHandle h = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, g / 2, &prop, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, g + 4096, &prop, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, 0, &prop, 0));

  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 2 * g, 0, 0, 0));
  ASSERT_CU(cuMemCreate(&h, g, &prop, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemMap(va + 4096, g, 0, h, 0))
      << "page- not granule-aligned ptr";
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemMap(va, g / 2, 0, h, 0))
      << "size not a granule multiple";
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemMap(va, g + 4096, 0, h, 0));
  // cuMemAddressReserve: "The size and address parameters must be a multiple
  // of the host page size and the alignment must be a power of two".
  CUdeviceptr bad = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAddressReserve(&bad, g + 1, 0, 0, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAddressReserve(&bad, g, 3 * 4096, 0, 0));
  // The aligned form still works afterwards.
  EXPECT_CU(cuMemMap(va, g, 0, h, 0));
  EXPECT_CU(cuMemUnmap(va, g));
  EXPECT_CU(cuMemRelease(h));
  EXPECT_CU(cuMemAddressFree(va, 2 * g));
}

// cuda.h cuMemMap: "offset - Offset into the memory represented by handle
// from which to start mapping - Note: currently must be zero." And "flags -
// flags for future use, must be zero now."
TEST(SimVmm, NonzeroOffsetOrFlagsIsInvalidValue) {
  init_primary();
  const size_t g = granularity();
  CUmemAllocationProp prop = device_prop();
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 2 * g, 0, 0, 0));
  CUmemGenericAllocationHandle h = 0;
  ASSERT_CU(cuMemCreate(&h, 2 * g, &prop, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemMap(va, g, g, h, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemMap(va, g, 0, h, 1));
  EXPECT_CU(cuMemMap(va, 2 * g, 0, h, 0));
  EXPECT_CU(cuMemUnmap(va, 2 * g));
  EXPECT_CU(cuMemRelease(h));
  EXPECT_CU(cuMemAddressFree(va, 2 * g));
}

// cuda.h cuMemAddressFree: "Frees a virtual address range reserved by
// cuMemAddressReserve. The size must match what was given to
// memAddressReserve and the ptr given must match". A reservation that still
// has mappings cannot be freed (the sim refuses; on hardware it is undefined).
TEST(SimVmm, AddressFreeWithMappingsIsRefused) {
  init_primary();
  const size_t g = granularity();
  VmmBlock b;
  ASSERT_CU(map_block(&b, g, device_prop()));
  auto data = pattern(g, 3);
  ASSERT_CU(cuMemcpyHtoD_v2(b.ptr, data.data(), g));
  EXPECT_NE(CUDA_SUCCESS, cuMemAddressFree(b.ptr, b.size));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAddressFree(b.ptr, 2 * b.size)) << "size mismatch";
  // The refused free left everything in place.
  std::vector<unsigned char> back(g);
  ASSERT_CU(cuMemcpyDtoH_v2(back.data(), b.ptr, g));
  EXPECT_EQ(data, back);
  unmap_block(b);
}

// cuda.h cuMemMap: "calling cuMemMap does not make the address accessible,
// the caller needs to update accessibility ... by calling cuMemSetAccess".
// A kernel touching such memory faults: CUDA_ERROR_ILLEGAL_ADDRESS is
// sticky ("the context cannot be used anymore, and must be destroyed").
TEST(SimVmmOwnProcess, KernelReadingWithoutAccessIsStickyIllegalAddress) {
  REQUIRE_OWN_PROCESS();
  init_primary();
  const size_t g = granularity();
  VmmBlock src, dst;
  ASSERT_CU(map_block(&src, g, device_prop(), /*grant=*/false));
  ASSERT_CU(map_block(&dst, g, device_prop()));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUfunction k = copy_kernel();
  ASSERT_CU(launch_copy(k, s, dst.ptr, src.ptr, g));
  EXPECT_EQ(CUDA_ERROR_ILLEGAL_ADDRESS, cuStreamSynchronize(s));
  // Sticky: every later call that needs the context fails the same way.
  EXPECT_EQ(CUDA_ERROR_ILLEGAL_ADDRESS, cuStreamSynchronize(s));
  EXPECT_EQ(CUDA_ERROR_ILLEGAL_ADDRESS, cuCtxSynchronize());
  CUdeviceptr d = 0;
  EXPECT_EQ(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemAlloc_v2(&d, 4096));
  unsigned char byte = 1;
  EXPECT_EQ(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemcpyHtoD_v2(dst.ptr, &byte, 1));
  EXPECT_EQ(CUDA_ERROR_ILLEGAL_ADDRESS, launch_copy(k, s, dst.ptr, dst.ptr, 1));
  char what[256] = {};
  EXPECT_EQ(CUDA_ERROR_ILLEGAL_ADDRESS, simcuda_sticky_error(0, what, sizeof what));
  std::string w(what);
  EXPECT_NE(std::string::npos, w.find("copy_kernel")) << w;
  uintptr_t at = fault_address(w);
  EXPECT_GE(at, src.ptr) << w;
  EXPECT_LT(at, src.ptr + g) << w;
  // No cleanup possible: the context is unusable (process exits).
}

// cuda.h cuMemUnmap: after unmapping "the address range is converted to an
// address reservation": reserved but unmapped VA is not accessible, and a
// kernel touching it gets the sticky CUDA_ERROR_ILLEGAL_ADDRESS.
TEST(SimVmmOwnProcess, KernelTouchingUnmappedReservationIsStickyIllegalAddress) {
  REQUIRE_OWN_PROCESS();
  init_primary();
  const size_t g = granularity();
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 2 * g, 0, 0, 0));
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp prop = device_prop();
  ASSERT_CU(cuMemCreate(&h, g, &prop, 0));
  ASSERT_CU(cuMemMap(va, g, 0, h, 0));
  ASSERT_CU(grant(va, g));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  // Writes into the second, unmapped granule.
  ASSERT_CU(launch_copy(copy_kernel(), s, va + g, va, 4096));
  EXPECT_EQ(CUDA_ERROR_ILLEGAL_ADDRESS, cuStreamSynchronize(s));
  EXPECT_EQ(CUDA_ERROR_ILLEGAL_ADDRESS, cuStreamQuery(s));
  EXPECT_EQ(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemUnmap(va, g));
  char what[256] = {};
  EXPECT_EQ(CUDA_ERROR_ILLEGAL_ADDRESS, simcuda_sticky_error(0, what, sizeof what));
  uintptr_t at = fault_address(what);
  EXPECT_GE(at, va + g) << what;
  EXPECT_LT(at, va + 2 * g) << what;
}

// cuda.h lists CUDA_ERROR_NOT_PERMITTED for cuMemUnmap and marks it
// \note_sync; hardware may tear the range down under queued work (PyTorch:
// cuMemUnmap "does not appear to synchronize in all cases"), so the sim
// refuses an unmap while pending work uses the range.
TEST(SimVmm, UnmapUnderPendingKernelIsNotPermitted) {
  init_primary();
  const size_t g = granularity();
  VmmBlock a, b;
  ASSERT_CU(map_block(&a, g, device_prop()));
  ASSERT_CU(map_block(&b, g, device_prop()));
  auto data = pattern(g, 4);
  ASSERT_CU(cuMemcpyHtoD_v2(a.ptr, data.data(), g));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(launch_sleep(sleep_kernel(), s, 300000));  // 300 ms of real time
  ASSERT_CU(launch_copy(copy_kernel(), s, b.ptr, a.ptr, g));
  EXPECT_EQ(CUDA_ERROR_NOT_PERMITTED, cuMemUnmap(a.ptr, a.size)) << "source of a pending kernel";
  EXPECT_EQ(CUDA_ERROR_NOT_PERMITTED, cuMemUnmap(b.ptr, b.size))
      << "destination of a pending kernel";
  ASSERT_CU(cuStreamSynchronize(s));
  std::vector<unsigned char> back(g);
  ASSERT_CU(cuMemcpyDtoH_v2(back.data(), b.ptr, g));
  EXPECT_EQ(data, back) << "the refused unmap did not disturb the kernel";
  unmap_block(a);  // now allowed
  unmap_block(b);
  EXPECT_CU(cuStreamDestroy_v2(s));
}

// cuda.h cuMemCreate returns CUDA_ERROR_OUT_OF_MEMORY; cuMemGetInfo "Returns
// in *total the total amount of memory available ... in *free the amount of
// memory on the device that is free".
TEST(SimVmmOwnProcess, DeviceCapacityOutOfMemoryAndMemGetInfo) {
  REQUIRE_OWN_PROCESS();
  setenv("SIMCUDA_DEVICE_MEMORY", "64MiB", 1);
  init_primary();
  unsetenv("SIMCUDA_DEVICE_MEMORY");
  constexpr size_t kCap = 64 * kMiB, kChunk = 16 * kMiB;
  size_t free_b = 0, total = 0, dev_total = 0;
  ASSERT_CU(cuMemGetInfo_v2(&free_b, &total));
  EXPECT_EQ(kCap, total);
  EXPECT_EQ(kCap, free_b);
  ASSERT_CU(cuDeviceTotalMem_v2(&dev_total, 0));
  EXPECT_EQ(kCap, dev_total);

  CUmemAllocationProp prop = device_prop();
  std::vector<CUmemGenericAllocationHandle> hs(4);
  for (size_t i = 0; i < hs.size(); ++i) {
    ASSERT_CU(cuMemCreate(&hs[i], kChunk, &prop, 0));
    ASSERT_CU(cuMemGetInfo_v2(&free_b, &total));
    EXPECT_EQ(kCap - (i + 1) * kChunk, free_b);
    EXPECT_EQ(kCap, total);
  }
  CUmemGenericAllocationHandle extra = 0;
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, cuMemCreate(&extra, granularity(), &prop, 0));
  CUdeviceptr d = 0;
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, cuMemAlloc_v2(&d, 4096)) << "classic allocations share it";
  ASSERT_CU(cuMemGetInfo_v2(&free_b, &total));
  EXPECT_EQ(0u, free_b);
  simcuda_memory_stats st = stats();
  EXPECT_EQ(kCap, st.device_capacity);
  EXPECT_EQ(kCap, st.device_used);

  ASSERT_CU(cuMemRelease(hs[0]));
  ASSERT_CU(cuMemGetInfo_v2(&free_b, &total));
  EXPECT_EQ(kChunk, free_b);
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, cuMemCreate(&extra, kChunk + granularity(), &prop, 0));
  ASSERT_CU(cuMemCreate(&hs[0], kChunk, &prop, 0));
  for (auto h : hs) EXPECT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemGetInfo_v2(&free_b, &total));
  EXPECT_EQ(kCap, free_b);
  st = stats();
  EXPECT_EQ(0u, st.device_used);
  EXPECT_EQ(kCap, st.device_peak);
}

// cuda.h cuMemCreate: "To create a CPU allocation targeting a specific host
// NUMA node, applications must set ... CU_MEM_LOCATION_TYPE_HOST_NUMA"; such
// memory is host memory: it counts against SIMCUDA_HOST_MEMORY (with pinned
// allocations), not the device.
TEST(SimVmmOwnProcess, HostLocatedCreateCountsAgainstHostMemory) {
  REQUIRE_OWN_PROCESS();
  setenv("SIMCUDA_HOST_MEMORY", "8MiB", 1);
  init_primary();
  unsetenv("SIMCUDA_HOST_MEMORY");
  const size_t g = granularity();
  ASSERT_EQ(2 * kMiB, g);
  CUmemAllocationProp hp = host_prop();
  CUmemGenericAllocationHandle h1 = 0, h2 = 0, h3 = 0;
  ASSERT_CU(cuMemCreate(&h1, 2 * g, &hp, 0));
  simcuda_memory_stats st = stats();
  EXPECT_EQ(8 * kMiB, st.host_capacity);
  EXPECT_EQ(4 * kMiB, st.host_used);
  EXPECT_EQ(0u, st.device_used) << "host-located memory is not device memory";
  ASSERT_CU(cuMemCreate(&h2, 2 * g, &hp, 0));
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, cuMemCreate(&h3, g, &hp, 0));
  void* pinned = nullptr;
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, cuMemHostAlloc(&pinned, 4096, 0)) << "same host cap";
  // Device-located memory is not limited by the host cap.
  CUmemAllocationProp dp = device_prop();
  CUmemGenericAllocationHandle hd = 0;
  EXPECT_CU(cuMemCreate(&hd, g, &dp, 0));
  EXPECT_CU(cuMemRelease(hd));

  ASSERT_CU(cuMemRelease(h1));
  EXPECT_EQ(4 * kMiB, stats().host_used);
  ASSERT_CU(cuMemHostAlloc(&pinned, kMiB, 0));
  EXPECT_EQ(5 * kMiB, stats().host_used);
  EXPECT_CU(cuMemFreeHost(pinned));
  EXPECT_CU(cuMemRelease(h2));
  st = stats();
  EXPECT_EQ(0u, st.host_used);
  EXPECT_EQ(8 * kMiB, st.host_peak);
}

// CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: "Device
// supports HOST_NUMA location with the virtual memory management APIs like
// cuMemCreate, cuMemMap and related APIs". Memory on the host mapped in device
// VA is reachable by kernels (over the link: remote_access_bytes).
TEST(SimVmm, HostLocatedMappingIsReadableByKernel) {
  init_primary();
  const size_t g = granularity();
  VmmBlock host, dev;
  ASSERT_CU(map_block(&host, g, host_prop()));
  ASSERT_CU(map_block(&dev, g, device_prop()));
  auto data = pattern(g, 5);
  ASSERT_CU(cuMemcpyHtoD_v2(host.ptr, data.data(), g));
  const uint64_t remote0 = stats().remote_access_bytes;
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(launch_copy(copy_kernel(), s, dev.ptr, host.ptr, g));
  ASSERT_CU(cuStreamSynchronize(s));
  std::vector<unsigned char> back(g);
  ASSERT_CU(cuMemcpyDtoH_v2(back.data(), dev.ptr, g));
  EXPECT_EQ(data, back);
  EXPECT_GE(stats().remote_access_bytes - remote0, g);
  EXPECT_CU(cuStreamDestroy_v2(s));
  unmap_block(host);
  unmap_block(dev);
}

// cuda.h cuMemCreate lists CUDA_ERROR_NOT_SUPPORTED; the attribute above says
// whether host-located VMM is supported.
TEST(SimVmmOwnProcess, HostNumaVmmDisabledIsNotSupported) {
  REQUIRE_OWN_PROCESS();
  setenv("SIMCUDA_HOST_NUMA_VMM", "0", 1);
  init_primary();
  unsetenv("SIMCUDA_HOST_NUMA_VMM");
  int v = -1;
  ASSERT_CU(cuDeviceGetAttribute(
      &v, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  EXPECT_EQ(0, v);
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp hp = host_prop();
  EXPECT_EQ(CUDA_ERROR_NOT_SUPPORTED, cuMemCreate(&h, granularity(), &hp, 0));
  hp.location.type = CU_MEM_LOCATION_TYPE_HOST;
  EXPECT_EQ(CUDA_ERROR_NOT_SUPPORTED, cuMemCreate(&h, granularity(), &hp, 0));
  EXPECT_EQ(0u, stats().host_used);
  CUmemAllocationProp dp = device_prop();
  ASSERT_CU(cuMemCreate(&h, granularity(), &dp, 0));
  EXPECT_CU(cuMemRelease(h));
}

// cuda.h cuMemCreate: "Specifying CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT as
// the CUmemLocation::type will result in CUDA_ERROR_INVALID_VALUE."
TEST(SimVmm, HostNumaCurrentLocationIsInvalidValue) {
  init_primary();
  CUmemAllocationProp hp = host_prop();
  hp.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
  CUmemGenericAllocationHandle h = 0;
  CUresult r = cuMemCreate(&h, granularity(), &hp, 0);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, r);
  if (r == CUDA_SUCCESS) {
    EXPECT_CU(cuMemRelease(h));
  }
}

// Memory another process holds is not free (cuMemGetInfo: "free according to
// the OS"); simcuda_set_external_usage models it.
TEST(SimVmmOwnProcess, ExternalUsageReducesWhatCreateGets) {
  REQUIRE_OWN_PROCESS();
  setenv("SIMCUDA_DEVICE_MEMORY", "64MiB", 1);
  init_primary();
  unsetenv("SIMCUDA_DEVICE_MEMORY");
  const size_t g = granularity();
  ASSERT_CU(simcuda_set_external_usage(0, 60 * kMiB));
  size_t free_b = 0, total = 0;
  ASSERT_CU(cuMemGetInfo_v2(&free_b, &total));
  EXPECT_EQ(4 * kMiB, free_b);
  EXPECT_EQ(64 * kMiB, total);
  EXPECT_EQ(60 * kMiB, stats().device_used);
  CUmemAllocationProp prop = device_prop();
  CUmemGenericAllocationHandle a = 0, b = 0;
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, cuMemCreate(&b, 4 * kMiB + g, &prop, 0));
  ASSERT_CU(cuMemCreate(&a, 4 * kMiB, &prop, 0));
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, cuMemCreate(&b, g, &prop, 0));
  ASSERT_CU(cuMemGetInfo_v2(&free_b, &total));
  EXPECT_EQ(0u, free_b);
  // More external usage than what is left is refused.
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, simcuda_set_external_usage(0, 62 * kMiB));
  ASSERT_CU(simcuda_set_external_usage(0, 0));
  ASSERT_CU(cuMemCreate(&b, 60 * kMiB, &prop, 0));
  EXPECT_CU(cuMemRelease(a));
  EXPECT_CU(cuMemRelease(b));
  EXPECT_EQ(0u, stats().device_used);
}

// cuda.h cuMemRelease lists CUDA_ERROR_INVALID_VALUE ("If handle is not a
// valid handle the behavior is undefined": the sim makes it an error).
TEST(SimVmm, ReleaseTwiceIsInvalidValue) {
  init_primary();
  CUmemAllocationProp prop = device_prop();
  CUmemGenericAllocationHandle h = 0;
  ASSERT_CU(cuMemCreate(&h, granularity(), &prop, 0));
  ASSERT_CU(cuMemRelease(h));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemRelease(h));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemRelease(0));
  // A released handle cannot be mapped either.
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, granularity(), 0, 0, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemMap(va, granularity(), 0, h, 0));
  EXPECT_CU(cuMemAddressFree(va, granularity()));
}

// cuda.h cuMemRelease: "The memory allocation will be freed when all
// outstanding mappings to the memory are unmapped and when all outstanding
// references to the handle ... are also released. The generic memory handle
// can be freed when there are still outstanding mappings made with this
// handle."
TEST(SimVmm, ReleaseWhileMappedKeepsMemoryUntilUnmap) {
  init_primary();
  const size_t g = granularity();
  const uint64_t used0 = stats().device_used;
  VmmBlock b;
  ASSERT_CU(map_block(&b, g, device_prop()));
  EXPECT_EQ(used0 + g, stats().device_used);
  auto data = pattern(g, 6);
  ASSERT_CU(cuMemcpyHtoD_v2(b.ptr, data.data(), g));
  ASSERT_CU(cuMemRelease(b.handle));
  EXPECT_EQ(used0 + g, stats().device_used) << "still mapped: not freed";
  // Still usable by copies and kernels.
  VmmBlock c;
  ASSERT_CU(map_block(&c, g, device_prop()));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(launch_copy(copy_kernel(), s, c.ptr, b.ptr, g));
  ASSERT_CU(cuStreamSynchronize(s));
  std::vector<unsigned char> back(g);
  ASSERT_CU(cuMemcpyDtoH_v2(back.data(), c.ptr, g));
  EXPECT_EQ(data, back);
  ASSERT_CU(cuMemcpyDtoH_v2(back.data(), b.ptr, g));
  EXPECT_EQ(data, back);
  ASSERT_CU(cuMemUnmap(b.ptr, g));
  EXPECT_EQ(used0 + g, stats().device_used) << "only c is left";
  EXPECT_CU(cuMemAddressFree(b.ptr, g));
  unmap_block(c);
  EXPECT_EQ(used0, stats().device_used);
  EXPECT_CU(cuStreamDestroy_v2(s));
}

// ---- classic allocations and pinned host memory -----------------------------

// cuda.h cuMemAlloc: "If bytesize is 0, cuMemAlloc() returns
// CUDA_ERROR_INVALID_VALUE." cuMemFree: dptr "must have been returned by a
// previous call to one of the following memory allocation APIs".
TEST(SimVmm, MemAllocFreeAndBadFrees) {
  init_primary();
  const uint64_t used0 = stats().device_used;
  const size_t n = kMiB + 1;
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc_v2(&d, n));
  EXPECT_NE(0u, d);
  EXPECT_GE(stats().device_used - used0, n);
  auto data = pattern(n, 7);
  ASSERT_CU(cuMemcpyHtoD_v2(d, data.data(), n));
  std::vector<unsigned char> back(n);
  ASSERT_CU(cuMemcpyDtoH_v2(back.data(), d, n));
  EXPECT_EQ(data, back);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemFree_v2(d + 4096)) << "interior pointer";
  ASSERT_CU(cuMemFree_v2(d));
  EXPECT_EQ(used0, stats().device_used);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemFree_v2(d)) << "double free";
  int local = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemFree_v2(D(&local))) << "host pointer";
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, granularity(), 0, 0, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemFree_v2(va)) << "a VMM reservation";
  EXPECT_CU(cuMemAddressFree(va, granularity()));
  CUdeviceptr z = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAlloc_v2(&z, 0));
}

// cuda.h cuMemHostAlloc / cuMemFreeHost: "Frees the memory space pointed to by
// p, which must have been returned by a previous call to cuMemAllocHost".
TEST(SimVmm, HostAllocAndFree) {
  init_primary();
  const uint64_t host0 = stats().host_used;
  void* p = nullptr;
  ASSERT_CU(cuMemHostAlloc(&p, 64 * 1024, CU_MEMHOSTALLOC_PORTABLE));
  ASSERT_NE(nullptr, p);
  EXPECT_EQ(host0 + 64 * 1024, stats().host_used);
  std::memset(p, 0x5a, 64 * 1024);  // ordinary host memory
  ASSERT_CU(cuMemFreeHost(p));
  EXPECT_EQ(host0, stats().host_used);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemFreeHost(p)) << "double free";
  int local = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemFreeHost(&local));
}

// cuda.h cuMemHostRegister lists CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
// cuMemHostUnregister lists CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED and says
// "The base address must be the same one specified to cuMemHostRegister()".
TEST(SimVmm, HostRegisterOverlapAndUnregisterUnknown) {
  init_primary();
  constexpr size_t kLen = 64 * 1024;
  void* raw = mmap(nullptr, 4 * kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(MAP_FAILED, raw);
  auto* base = static_cast<unsigned char*>(raw);
  unsigned char* mid = base + kLen;
  const uint64_t host0 = stats().host_used;
  ASSERT_CU(cuMemHostRegister_v2(mid, kLen, 0));
  EXPECT_EQ(host0 + kLen, stats().host_used);
  EXPECT_EQ(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, cuMemHostRegister_v2(mid, kLen, 0));
  EXPECT_EQ(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, cuMemHostRegister_v2(mid + 4096, 4096, 0))
      << "inside";
  EXPECT_EQ(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, cuMemHostRegister_v2(base, kLen + 4096, 0))
      << "runs into it";
  EXPECT_EQ(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
            cuMemHostRegister_v2(mid + kLen - 4096, 2 * 4096, 0))
      << "starts inside, runs past it";
  // Memory from cuMemHostAlloc is already pinned too.
  void* pinned = nullptr;
  ASSERT_CU(cuMemHostAlloc(&pinned, kLen, 0));
  EXPECT_EQ(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, cuMemHostRegister_v2(pinned, kLen, 0));
  EXPECT_CU(cuMemFreeHost(pinned));
  // Adjacent ranges are fine.
  EXPECT_CU(cuMemHostRegister_v2(base, kLen, 0));
  EXPECT_CU(cuMemHostUnregister(base));

  EXPECT_EQ(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, cuMemHostUnregister(mid + 4096))
      << "not the base address";
  ASSERT_CU(cuMemHostUnregister(mid));
  EXPECT_EQ(host0, stats().host_used);
  EXPECT_EQ(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, cuMemHostUnregister(mid)) << "twice";
  EXPECT_EQ(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, cuMemHostUnregister(base + 3 * kLen))
      << "never registered";
  munmap(raw, 4 * kLen);
}

// ---- copies and memsets ------------------------------------------------------

// CUDA driver API docs, "API synchronization behavior" (cuda.h \note_async on
// cuMemcpyHtoDAsync): "For transfers from pageable host memory to device
// memory, host memory is copied to a staging buffer immediately (no device
// synchronization is performed)"; the sim is stricter: the copy is synchronous,
// and done when the call returns (the source may be reused at once).
TEST(SimVmm, AsyncCopyFromPageableIsSynchronous) {
  init_primary();
  const size_t g = granularity();
  VmmBlock b;
  ASSERT_CU(map_block(&b, g, device_prop()));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  constexpr uint64_t kKernelNs = 50'000'000;  // 50 ms of virtual time
  const uint64_t t0 = simcuda_now_ns();
  ASSERT_CU(launch_sleep(sleep_kernel(kKernelNs), s, 50000));  // 50 ms real
  const uint64_t kernel_end = simcuda_device_idle_at_ns(0);
  EXPECT_GE(kernel_end, t0 + kKernelNs);
  auto data = pattern(g, 8);
  std::vector<unsigned char> src = data;
  ASSERT_CU(cuMemcpyHtoDAsync_v2(b.ptr, src.data(), g, s));
  EXPECT_GE(simcuda_now_ns(), kernel_end) << "the host waited for the kernel and the copy";
  EXPECT_EQ(CUDA_SUCCESS, cuStreamQuery(s)) << "nothing left on the stream";
  std::fill(src.begin(), src.end(), 0xEE);  // the source is free for reuse
  // Read back on the legacy stream, which does not wait for a non-blocking one.
  std::vector<unsigned char> back(g);
  ASSERT_CU(cuMemcpyDtoH_v2(back.data(), b.ptr, g));
  EXPECT_EQ(data, back);
  EXPECT_CU(cuStreamDestroy_v2(s));
  unmap_block(b);
}

// cuda.h \note_async: "This function exhibits asynchronous behavior for most
// use cases": from pinned memory the call returns before the copy is done.
TEST(SimVmm, AsyncCopyFromPinnedReturnsBeforeTheWork) {
  init_primary();
  const size_t g = granularity();
  VmmBlock b;
  ASSERT_CU(map_block(&b, g, device_prop()));
  void* pinned = nullptr;
  ASSERT_CU(cuMemHostAlloc(&pinned, g, 0));
  auto data = pattern(g, 9);
  std::memcpy(pinned, data.data(), g);
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  constexpr uint64_t kKernelNs = 50'000'000;
  const uint64_t t0 = simcuda_now_ns();
  ASSERT_CU(launch_sleep(sleep_kernel(kKernelNs), s, 100000));  // 100 ms real
  ASSERT_CU(cuMemcpyHtoDAsync_v2(b.ptr, pinned, g, s));
  EXPECT_LT(simcuda_now_ns(), t0 + kKernelNs) << "the host did not wait";
  EXPECT_EQ(CUDA_ERROR_NOT_READY, cuStreamQuery(s));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_GE(simcuda_now_ns(), t0 + kKernelNs);
  std::vector<unsigned char> back(g);
  ASSERT_CU(cuMemcpyDtoH_v2(back.data(), b.ptr, g));
  EXPECT_EQ(data, back);
  EXPECT_CU(cuStreamDestroy_v2(s));
  EXPECT_CU(cuMemFreeHost(pinned));
  unmap_block(b);
}

// cuda.h cuMemcpyHtoD: "Copies from host memory to device memory. dstDevice
// and srcHost are the base addresses of the destination and source";
// cuMemcpyDtoH the reverse. The wrong side is an error.
TEST(SimVmm, CopyInTheWrongDirectionIsInvalidValue) {
  init_primary();
  const size_t g = granularity();
  VmmBlock a, b;
  ASSERT_CU(map_block(&a, g, device_prop()));
  ASSERT_CU(map_block(&b, g, device_prop()));
  std::vector<unsigned char> h1(4096, 1), h2(4096, 2);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoD_v2(D(h1.data()), h2.data(), 4096)) << "host dst";
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoD_v2(a.ptr, P(b.ptr), 4096)) << "device src";
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoH_v2(h1.data(), D(h2.data()), 4096)) << "host src";
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoH_v2(P(a.ptr), b.ptr, 4096)) << "device dst";
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoD_v2(a.ptr, D(h1.data()), 4096)) << "host src";
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoDAsync_v2(D(h1.data()), h2.data(), 4096, nullptr));
  EXPECT_EQ(std::vector<unsigned char>(4096, 1), h1) << "a refused copy moved bytes";
  unmap_block(a);
  unmap_block(b);
}

// cuda.h cuMemsetD16: "The dstDevice pointer must be two byte aligned.";
// cuMemsetD32: "The dstDevice pointer must be four byte aligned."
TEST(SimVmm, MemsetAlignment) {
  init_primary();
  const size_t g = granularity();
  VmmBlock b;
  ASSERT_CU(map_block(&b, g, device_prop()));
  ASSERT_CU(cuMemsetD8_v2(b.ptr, 0, 64));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemsetD16_v2(b.ptr + 1, 0xBEEF, 4));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemsetD32_v2(b.ptr + 2, 0xDEADBEEF, 4));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemsetD32_v2(b.ptr + 1, 0xDEADBEEF, 4));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemsetD16Async(b.ptr + 3, 1, 4, nullptr));
  ASSERT_CU(cuMemsetD16_v2(b.ptr + 2, 0xBEEF, 2));
  ASSERT_CU(cuMemsetD32_v2(b.ptr + 8, 0xDEADBEEFu, 2));
  unsigned char back[16];
  ASSERT_CU(cuMemcpyDtoH_v2(back, b.ptr, sizeof back));
  const unsigned char want[16] = {0,    0,    0xEF, 0xBE, 0xEF, 0xBE, 0,    0,
                                  0xEF, 0xBE, 0xAD, 0xDE, 0xEF, 0xBE, 0xAD, 0xDE};
  EXPECT_EQ(0, std::memcmp(want, back, sizeof want));
  std::vector<unsigned char> host(64);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemsetD8_v2(D(host.data()), 1, 64)) << "host memory";
  unmap_block(b);
}

// ---- device facts and error strings ------------------------------------------

// The device spillway targets (H100 SXM defaults, docs/sim.md): VMM and host
// NUMA VMM supported, one NUMA node (CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID "NUMA ID
// of the host node closest to the device"), 2 MiB granularity, 80 GiB.
TEST(SimVmm, DeviceAttributesAndTotalMem) {
  init_primary();
  struct {
    CUdevice_attribute attr;
    int want;
    const char* name;
  } const cases[] = {
      {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1, "VMM"},
      {CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1, "HOST_NUMA_VMM"},
      {CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 1, "CONCURRENT_MANAGED_ACCESS"},
      {CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 0, "HOST_NUMA_ID"},
      {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1, "UNIFIED_ADDRESSING"},
  };
  for (const auto& c : cases) {
    int v = -7;
    EXPECT_CU(cuDeviceGetAttribute(&v, c.attr, 0)) << c.name;
    EXPECT_EQ(c.want, v) << c.name;
  }
  int v = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE,
            cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1));
  CUmemAllocationProp prop = device_prop();
  size_t gmin = 0, grec = 0;
  ASSERT_CU(cuMemGetAllocationGranularity(&gmin, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  ASSERT_CU(cuMemGetAllocationGranularity(&grec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  EXPECT_EQ(2 * kMiB, gmin);
  EXPECT_EQ(2 * kMiB, grec);
  CUmemAllocationProp hp = host_prop();
  ASSERT_CU(cuMemGetAllocationGranularity(&gmin, &hp, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  EXPECT_EQ(2 * kMiB, gmin);
  size_t total = 0;
  ASSERT_CU(cuDeviceTotalMem_v2(&total, 0));
  EXPECT_EQ(size_t{80} << 30, total);
  EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE, cuDeviceTotalMem_v2(&total, 1));
}

// cuda.h cuGetErrorName / cuGetErrorString: "If the error code is not
// recognized, CUDA_ERROR_INVALID_VALUE will be returned and *pStr will be set
// to the NULL address."
TEST(SimVmm, ErrorNamesAndStrings) {
  const char* s = nullptr;
  ASSERT_CU(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s));
  EXPECT_STREQ("CUDA_ERROR_OUT_OF_MEMORY", s);
  s = nullptr;
  ASSERT_CU(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s));
  EXPECT_STREQ("out of memory", s);
  ASSERT_CU(cuGetErrorName(CUDA_ERROR_ILLEGAL_ADDRESS, &s));
  EXPECT_STREQ("CUDA_ERROR_ILLEGAL_ADDRESS", s);
  // Not a code cuda.h defines, but inside the enum's range (0..1023; a value
  // outside it would be undefined behaviour in the test itself).
  const auto unknown = static_cast<CUresult>(555);
  s = "not touched";
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuGetErrorName(unknown, &s));
  EXPECT_EQ(nullptr, s);
  s = "not touched";
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuGetErrorString(unknown, &s));
  EXPECT_EQ(nullptr, s);
}

// SIMCUDA_DATA=0 (docs/sim.md): the accounting mode of large replays. Copies
// and memsets are timed and counted as with data, move no byte, and a range
// the device may not access still faults.
TEST(SimVmmOwnProcess, WithoutDataCopiesAreTimedAndCheckedButMoveNoByte) {
  REQUIRE_OWN_PROCESS();
  setenv("SIMCUDA_DATA", "0", 1);
  init_primary();
  unsetenv("SIMCUDA_DATA");
  const size_t g = granularity();
  VmmBlock dev, closed;
  ASSERT_CU(map_block(&dev, g, device_prop()));
  std::vector<unsigned char> out(g, 0xAB), back(g, 0x11);
  const uint64_t t0 = simcuda_now_ns();
  ASSERT_CU(cuMemcpyHtoD_v2(dev.ptr, out.data(), g));
  ASSERT_CU(cuMemsetD8_v2(dev.ptr, 0x5A, g));
  ASSERT_CU(cuMemcpyDtoH_v2(back.data(), dev.ptr, g));
  EXPECT_EQ(std::vector<unsigned char>(g, 0x11), back) << "a byte moved";
  EXPECT_EQ(g, stats().bytes_h2d);
  EXPECT_EQ(g, stats().bytes_d2h);
  // Both copies cost their link time (55 GB/s by default: 2 MiB in ~38 us).
  EXPECT_GE(simcuda_now_ns() - t0, 2 * g / 55);

  ASSERT_CU(map_block(&closed, g, device_prop(), /*grant=*/false));
  EXPECT_EQ(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemcpyDtoH_v2(back.data(), closed.ptr, g));
}

// A part of an allocation cannot be mapped: an H100 refused the first
// granule of a two-granule handle with CUDA_ERROR_NOT_SUPPORTED (docs/gpu.md,
// run 17), though cuda.h's text reads as if it were allowed.
TEST(SimVmm, MappingAPartOfAnAllocationIsNotSupported) {
  init_primary();
  const size_t g = granularity();
  CUmemAllocationProp prop = device_prop();
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 2 * g, 0, 0, 0));
  CUmemGenericAllocationHandle h = 0;
  ASSERT_CU(cuMemCreate(&h, 2 * g, &prop, 0));
  EXPECT_EQ(CUDA_ERROR_NOT_SUPPORTED, cuMemMap(va, g, 0, h, 0));
  EXPECT_CU(cuMemMap(va, 2 * g, 0, h, 0));  // the whole of it is
  EXPECT_CU(cuMemUnmap(va, 2 * g));
  EXPECT_CU(cuMemRelease(h));
  EXPECT_CU(cuMemAddressFree(va, 2 * g));
}
