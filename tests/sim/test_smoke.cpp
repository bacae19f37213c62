// End-to-end basics: memory, copies, a kernel, through the real entry points.
#include <cstring>
#include <vector>

#include "sim_test_util.h"

using namespace simtest;

TEST(SimSmoke, CopyKernelRoundTrip) {
  init_primary();
  VmmBlock a, b;
  size_t g = granularity();
  ASSERT_CU(map_block(&a, g, device_prop()));
  ASSERT_CU(map_block(&b, g, device_prop()));
  std::vector<unsigned char> host(g), back(g);
  for (size_t i = 0; i < g; ++i) host[i] = static_cast<unsigned char>(i * 7);
  CUstream s;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuMemcpyHtoD_v2(a.ptr, host.data(), g));  // pageable: synchronous
  CUfunction k = copy_kernel();
  void* dst = reinterpret_cast<void*>(b.ptr);
  void* src = reinterpret_cast<void*>(a.ptr);
  size_t n = g;
  void* params[] = {&dst, &src, &n};
  ASSERT_CU(launch(k, s, params));
  ASSERT_CU(cuStreamSynchronize(s));
  ASSERT_CU(cuMemcpyDtoH_v2(back.data(), b.ptr, g));
  EXPECT_EQ(0, std::memcmp(host.data(), back.data(), g));
  ASSERT_CU(cuStreamDestroy_v2(s));
  unmap_block(a);
  unmap_block(b);
}
