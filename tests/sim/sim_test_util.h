// Helpers shared by the simulator's tests.
#pragma once

#include <cuda.h>
#include <gtest/gtest.h>
#include <simcuda.h>

#include <cstdint>
#include <string>

// A ThreadSanitizer build (GCC defines __SANITIZE_THREAD__; Clang has the
// feature test): for the few tests that race on purpose.
#if defined(__SANITIZE_THREAD__)
#define SIMTEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SIMTEST_TSAN 1
#endif
#endif

#define ASSERT_CU(expr) ASSERT_EQ(CUDA_SUCCESS, (expr)) << #expr
#define EXPECT_CU(expr) EXPECT_EQ(CUDA_SUCCESS, (expr)) << #expr

namespace simtest {

// cuInit + primary context of device 0 made current.
CUcontext init_primary();

// A granule-aligned VMM allocation: reserve + create + map + access.
struct VmmBlock {
  CUdeviceptr ptr = 0;
  size_t size = 0;
  CUmemGenericAllocationHandle handle = 0;
};
CUmemAllocationProp device_prop(int device = 0);
CUmemAllocationProp host_prop();
size_t granularity();
CUresult map_block(VmmBlock* b, size_t size, const CUmemAllocationProp& prop, bool grant = true);
void unmap_block(const VmmBlock& b);

// A kernel that copies `n` bytes from `src` to `dst` (params: dst, src, n).
CUfunction copy_kernel(uint64_t duration_ns = 1000);
// A kernel that sleeps for real (params: microseconds) and declares `duration_ns`.
CUfunction sleep_kernel(uint64_t duration_ns = 1000);
CUresult launch(CUfunction f, CUstream s, void** params);

}  // namespace simtest
