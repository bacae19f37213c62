// Fault injection (SIMCUDA_FAIL, simcuda_fail_call) and call counting.
// SIMCUDA_FAIL is read at cuInit, so the SimFaultsOwnProcess tests need a
// process of their own: ctest gives every test one (gtest_discover_tests);
// run directly, they skip unless selected alone with --gtest_filter.
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "sim_test_util.h"

using namespace simtest;

namespace {

#define REQUIRE_OWN_PROCESS()                                                         \
  do {                                                                                \
    if (::testing::UnitTest::GetInstance()->test_to_run_count() != 1)                 \
      GTEST_SKIP() << "needs a process of its own: run it alone with --gtest_filter " \
                      "(ctest does)";                                                 \
  } while (0)

// Sets SIMCUDA_FAIL, initializes, and unsets it again.
void init_with_faults(const char* spec) {
  setenv("SIMCUDA_FAIL", spec, 1);
  init_primary();
  unsetenv("SIMCUDA_FAIL");
}

// Clears runtime faults however the test ends.
struct ClearFaults {
  ~ClearFaults() { simcuda_clear_faults(); }
};

simcuda_memory_stats stats() {
  simcuda_memory_stats s{};
  simcuda_get_memory_stats(0, &s);
  return s;
}

// cuInit with a malformed SIMCUDA_FAIL: refused, with a message naming it.
void expect_malformed(const char* spec) {
  setenv("SIMCUDA_FAIL", spec, 1);
  testing::internal::CaptureStderr();
  CUresult r = cuInit(0);
  std::string err = testing::internal::GetCapturedStderr();
  unsetenv("SIMCUDA_FAIL");
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, r) << spec;
  EXPECT_NE(std::string::npos, err.find("SIMCUDA_FAIL")) << "stderr: " << err;
  EXPECT_NE(std::string::npos, err.find(spec)) << "stderr: " << err;
  // The failure is final for the process, and nothing is initialized.
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuInit(0));
  int n = 0;
  EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED, cuDeviceGetCount(&n));
}

using HtoDAsync = decltype(&cuMemcpyHtoDAsync_v2);
using DtoHAsync = decltype(&cuMemcpyDtoHAsync_v2);

template <class Fn>
Fn per_thread(const char* base) {
  void* p = nullptr;
  EXPECT_EQ(
      CUDA_SUCCESS,
      cuGetProcAddress_v2(base, &p, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, nullptr));
  return reinterpret_cast<Fn>(p);
}

}  // namespace

// Allocation calls fail with what cuda.h lists for running out
// (CUDA_ERROR_OUT_OF_MEMORY); exactly the 3rd call, not the ones around it.
TEST(SimFaultsOwnProcess, NthMemCreateFailsWithOutOfMemory) {
  REQUIRE_OWN_PROCESS();
  init_with_faults("cuMemCreate:3");
  CUmemAllocationProp prop = device_prop();
  const size_t g = granularity();
  std::vector<CUmemGenericAllocationHandle> hs;
  for (int i = 1; i <= 5; ++i) {
    CUmemGenericAllocationHandle h = 0;
    CUresult r = cuMemCreate(&h, g, &prop, 0);
    if (i == 3) {
      EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, r) << "call " << i;
    } else {
      EXPECT_EQ(CUDA_SUCCESS, r) << "call " << i;
      if (r == CUDA_SUCCESS) hs.push_back(h);
    }
  }
  EXPECT_EQ(4u, hs.size());
  EXPECT_EQ(4 * g, stats().device_used) << "the failed call allocated nothing";
  EXPECT_EQ(5u, simcuda_call_count("cuMemCreate")) << "failed calls count too";
  for (auto h : hs) EXPECT_CU(cuMemRelease(h));
}

// Other calls fail with CUDA_ERROR_INVALID_VALUE, and an injected failure
// does nothing: the copy moves no bytes.
TEST(SimFaultsOwnProcess, NthAsyncDtoHFailsAndMovesNothing) {
  REQUIRE_OWN_PROCESS();
  init_with_faults("cuMemcpyDtoHAsync_v2:2");
  const size_t n = 64 * 1024;
  VmmBlock b;
  ASSERT_CU(map_block(&b, granularity(), device_prop()));
  ASSERT_CU(cuMemsetD8_v2(b.ptr, 0x11, n));
  void* pinned = nullptr;
  ASSERT_CU(cuMemHostAlloc(&pinned, n, 0));
  auto* dst = static_cast<unsigned char*>(pinned);
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

  std::memset(dst, 0xEE, n);
  ASSERT_CU(cuMemcpyDtoHAsync_v2(dst, b.ptr, n, s));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(0x11, dst[0]);
  EXPECT_EQ(0x11, dst[n - 1]);

  ASSERT_CU(cuMemsetD8_v2(b.ptr, 0x22, n));
  std::memset(dst, 0xEE, n);
  const uint64_t d2h = stats().bytes_d2h;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoHAsync_v2(dst, b.ptr, n, s));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(std::vector<unsigned char>(n, 0xEE), std::vector<unsigned char>(dst, dst + n))
      << "the failed copy wrote the destination";
  EXPECT_EQ(d2h, stats().bytes_d2h) << "the failed copy was charged to the copy engine";

  ASSERT_CU(cuMemcpyDtoHAsync_v2(dst, b.ptr, n, s)) << "only the 2nd call fails";
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(0x22, dst[n / 2]);

  EXPECT_CU(cuStreamDestroy_v2(s));
  EXPECT_CU(cuMemFreeHost(pinned));
  unmap_block(b);
}

// A base name matches the versioned export (cuMemcpyDtoHAsync ->
// cuMemcpyDtoHAsync_v2), as cuGetProcAddress names it.
TEST(SimFaultsOwnProcess, BaseNameMatchesVersionedCall) {
  REQUIRE_OWN_PROCESS();
  init_with_faults("cuMemcpyDtoHAsync:1");
  VmmBlock b;
  ASSERT_CU(map_block(&b, granularity(), device_prop()));
  std::vector<unsigned char> host(4096, 0xEE);
  ASSERT_CU(cuMemsetD8_v2(b.ptr, 0x33, host.size()));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuMemcpyDtoHAsync_v2(host.data(), b.ptr, host.size(), nullptr));
  EXPECT_EQ(0xEE, host[0]);
  EXPECT_CU(cuMemcpyDtoHAsync_v2(host.data(), b.ptr, host.size(), nullptr));
  EXPECT_EQ(0x33, host[0]) << "pageable: synchronous";
  unmap_block(b);
}

// "name:n+" fails call n and every later one.
TEST(SimFaultsOwnProcess, PlusFormFailsEveryCallFromN) {
  REQUIRE_OWN_PROCESS();
  init_with_faults("cuMemAlloc:2+");
  CUdeviceptr d1 = 0, d = 0;
  ASSERT_CU(cuMemAlloc_v2(&d1, 4096));
  for (int i = 2; i <= 5; ++i)
    EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, cuMemAlloc_v2(&d, 4096)) << "call " << i;
  simcuda_clear_faults();
  ASSERT_CU(cuMemAlloc_v2(&d, 4096)) << "cleared";
  EXPECT_CU(cuMemFree_v2(d));
  EXPECT_CU(cuMemFree_v2(d1));
}

// "name:n:CUDA_ERROR_X" names the error to return.
TEST(SimFaultsOwnProcess, ExplicitErrorIsReturned) {
  REQUIRE_OWN_PROCESS();
  init_with_faults("cuMemHostAlloc:1:CUDA_ERROR_NOT_PERMITTED");
  void* p = nullptr;
  EXPECT_EQ(CUDA_ERROR_NOT_PERMITTED, cuMemHostAlloc(&p, 4096, 0));
  EXPECT_EQ(0u, stats().host_used);
  ASSERT_CU(cuMemHostAlloc(&p, 4096, 0));
  EXPECT_CU(cuMemFreeHost(p));
}

// Several comma-separated items apply independently.
TEST(SimFaultsOwnProcess, SeveralItems) {
  REQUIRE_OWN_PROCESS();
  init_with_faults("cuMemCreate:1,cuMemHostAlloc:1:CUDA_ERROR_INVALID_VALUE");
  CUmemAllocationProp prop = device_prop();
  CUmemGenericAllocationHandle h = 0;
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, cuMemCreate(&h, granularity(), &prop, 0));
  void* p = nullptr;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemHostAlloc(&p, 4096, 0));
  ASSERT_CU(cuMemCreate(&h, granularity(), &prop, 0));
  EXPECT_CU(cuMemRelease(h));
}

TEST(SimFaultsOwnProcess, MalformedSpecWithoutCountFailsInit) {
  REQUIRE_OWN_PROCESS();
  expect_malformed("cuMemCreate");
}

TEST(SimFaultsOwnProcess, MalformedSpecWithZeroCountFailsInit) {
  REQUIRE_OWN_PROCESS();
  expect_malformed("cuMemCreate:0");
}

TEST(SimFaultsOwnProcess, MalformedSpecWithUnknownErrorFailsInit) {
  REQUIRE_OWN_PROCESS();
  expect_malformed("x:1:CUDA_ERROR_BOGUS");
}

// A call number is digits only: strtoull alone would wrap -1 around to the
// last call, take a blank or a sign, and clamp 2^64 to 2^64-1.
TEST(SimFaultsOwnProcess, MalformedSpecWithNegativeCountFailsInit) {
  REQUIRE_OWN_PROCESS();
  expect_malformed("cuMemCreate:-1");
}

TEST(SimFaultsOwnProcess, MalformedSpecWithBlankBeforeCountFailsInit) {
  REQUIRE_OWN_PROCESS();
  expect_malformed("cuMemCreate: 3+");
}

TEST(SimFaultsOwnProcess, MalformedSpecWithCountPast64BitsFailsInit) {
  REQUIRE_OWN_PROCESS();
  expect_malformed("cuMemCreate:18446744073709551616");
}

// The largest call number is taken (a rule that never fires in practice).
TEST(SimFaultsOwnProcess, ACountOf64BitsIsAccepted) {
  REQUIRE_OWN_PROCESS();
  init_with_faults("cuMemCreate:18446744073709551615");
  CUmemAllocationProp prop = device_prop();
  CUmemGenericAllocationHandle h = 0;
  ASSERT_CU(cuMemCreate(&h, granularity(), &prop, 0));
  EXPECT_CU(cuMemRelease(h));
}

// A refusal stays one line: a newline in the value is shown escaped.
TEST(SimFaultsOwnProcess, ARefusalShowsAControlCharacterEscaped) {
  REQUIRE_OWN_PROCESS();
  setenv("SIMCUDA_FAIL", "cuMemCreate:1\nx", 1);
  testing::internal::CaptureStderr();
  CUresult r = cuInit(0);
  std::string err = testing::internal::GetCapturedStderr();
  unsetenv("SIMCUDA_FAIL");
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, r);
  EXPECT_NE(std::string::npos, err.find("'cuMemCreate:1\\x0ax'")) << err;
  EXPECT_EQ(err.size() - 1, err.find('\n')) << "one line: " << err;
}

// simcuda_fail_call: the nth call from now on; simcuda_clear_faults removes
// every rule.
TEST(SimFaults, RuntimeFailCallAndClear) {
  init_primary();
  ClearFaults guard;
  CUmemAllocationProp prop = device_prop();
  const size_t g = granularity();
  ASSERT_CU(simcuda_fail_call("cuMemCreate", 2, 0, CUDA_ERROR_OUT_OF_MEMORY));
  CUmemGenericAllocationHandle h1 = 0, h2 = 0, h3 = 0;
  ASSERT_CU(cuMemCreate(&h1, g, &prop, 0));
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, cuMemCreate(&h2, g, &prop, 0));
  ASSERT_CU(cuMemCreate(&h2, g, &prop, 0));

  // and_after with an explicit error, then cleared.
  ASSERT_CU(simcuda_fail_call("cuMemRelease", 1, 1, CUDA_ERROR_NOT_PERMITTED));
  EXPECT_EQ(CUDA_ERROR_NOT_PERMITTED, cuMemRelease(h1));
  EXPECT_EQ(CUDA_ERROR_NOT_PERMITTED, cuMemRelease(h2));
  simcuda_clear_faults();
  EXPECT_CU(cuMemRelease(h1)) << "the injected failures did not release";
  EXPECT_CU(cuMemRelease(h2));
  ASSERT_CU(cuMemCreate(&h3, g, &prop, 0));
  EXPECT_CU(cuMemRelease(h3));

  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            simcuda_fail_call("cuMemCreate", 0, 0, CUDA_ERROR_OUT_OF_MEMORY))
      << "calls are numbered from 1";
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, simcuda_fail_call(nullptr, 1, 0, CUDA_ERROR_OUT_OF_MEMORY));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, simcuda_fail_call("", 1, 0, CUDA_ERROR_OUT_OF_MEMORY));
}

// A base-name rule counts every variant: the 2nd call overall is the _ptsz one.
TEST(SimFaults, BaseNameRuleCountsAllVariants) {
  init_primary();
  ClearFaults guard;
  VmmBlock b;
  ASSERT_CU(map_block(&b, granularity(), device_prop()));
  ASSERT_CU(cuMemsetD8_v2(b.ptr, 0x44, 4096));
  auto ptsz = per_thread<DtoHAsync>("cuMemcpyDtoHAsync");
  ASSERT_NE(nullptr, ptsz);
  ASSERT_NE(reinterpret_cast<void*>(ptsz), reinterpret_cast<void*>(&cuMemcpyDtoHAsync_v2));
  std::vector<unsigned char> host(4096, 0xEE);
  ASSERT_CU(simcuda_fail_call("cuMemcpyDtoHAsync", 2, 0, CUDA_ERROR_INVALID_VALUE));
  ASSERT_CU(cuMemcpyDtoHAsync_v2(host.data(), b.ptr, 16, nullptr));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, ptsz(host.data() + 16, b.ptr, 16, nullptr));
  EXPECT_EQ(0xEE, host[16]);
  EXPECT_CU(ptsz(host.data() + 16, b.ptr, 16, nullptr));
  EXPECT_EQ(0x44, host[16]);
  simcuda_clear_faults();
  unmap_block(b);
}

// simcuda_call_count: "by exported name, e.g. cuMemCreate or
// cuMemcpyHtoDAsync_v2 (base names count all variants)".
TEST(SimFaults, CallCountByExportedAndBaseName) {
  init_primary();
  VmmBlock b;
  ASSERT_CU(map_block(&b, granularity(), device_prop()));
  auto ptsz = per_thread<HtoDAsync>("cuMemcpyHtoDAsync");
  ASSERT_NE(nullptr, ptsz);
  const uint64_t v2 = simcuda_call_count("cuMemcpyHtoDAsync_v2");
  const uint64_t v2_ptsz = simcuda_call_count("cuMemcpyHtoDAsync_v2_ptsz");
  const uint64_t base = simcuda_call_count("cuMemcpyHtoDAsync");
  const uint64_t create = simcuda_call_count("cuMemCreate");
  std::vector<unsigned char> host(256, 1);
  ASSERT_CU(cuMemcpyHtoDAsync_v2(b.ptr, host.data(), host.size(), nullptr));
  ASSERT_CU(cuMemcpyHtoDAsync_v2(b.ptr, host.data(), host.size(), nullptr));
  ASSERT_CU(ptsz(b.ptr, host.data(), host.size(), nullptr));
  ASSERT_CU(cuStreamSynchronize(CU_STREAM_PER_THREAD));
  EXPECT_EQ(v2 + 2, simcuda_call_count("cuMemcpyHtoDAsync_v2"));
  EXPECT_EQ(v2_ptsz + 1, simcuda_call_count("cuMemcpyHtoDAsync_v2_ptsz"));
  EXPECT_EQ(base + 3, simcuda_call_count("cuMemcpyHtoDAsync"));
  // A refused call is still a call.
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp prop = device_prop();
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, 1, &prop, 0));
  EXPECT_EQ(create + 1, simcuda_call_count("cuMemCreate"));
  EXPECT_EQ(0u, simcuda_call_count("cuNoSuchFunction"));
  EXPECT_EQ(0u, simcuda_call_count(nullptr));
  unmap_block(b);
}
