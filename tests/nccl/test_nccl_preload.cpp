// libspillway.so's exported NCCL definitions as a process sees them: a
// program linked against libspillway.so before libnccl.so.2 (what
// LD_PRELOAD amounts to) calls spillway's ncclAllReduce, which restores an
// evicted buffer and forwards to NCCL; without any NCCL loaded the call
// fails cleanly. Child processes get a controlled environment.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

struct Child {
  int status = -1;
  std::string out;
};

Child run(const std::string& probe, const std::string& arg) {
  std::string env = "env -i SPILLWAY_GPU_BUDGET=8MiB SPILLWAY_CUPTI=off SPILLWAY_LOG_LEVEL=error";
  for (const char* keep : {"ASAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS", "LSAN_OPTIONS"})
    if (const char* v = std::getenv(keep)) env += std::string(" ") + keep + "='" + v + "'";
  const std::string cmd = env + " '" + probe + "' " + arg + " 2>&1";
  Child r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) r.out.append(buf, n);
  r.status = pclose(p);
  return r;
}

TEST(NcclPreload, TheSharedLibrarysHooksRestoreAnEvictedBufferAndForward) {
  Child r = run(NCCL_PROBE, "evicted");
  ASSERT_EQ(0, r.status) << r.out;
  EXPECT_NE(std::string::npos, r.out.find("result=0\n")) << r.out;
  EXPECT_EQ(std::string::npos, r.out.find("evicted=0\n")) << r.out;
  // No CUPTI here (SPILLWAY_CUPTI=off): only the interposed call restores.
  EXPECT_NE(std::string::npos, r.out.find("restored_by_call=1\n")) << r.out;
  EXPECT_NE(std::string::npos, r.out.find("bytes_ok=1\n")) << r.out;
}

TEST(NcclPreload, WithoutNcclLoadedTheCallsReturnSystemError) {
  Child r = run(NCCL_PROBE_NONCCL, "nonccl");
  ASSERT_EQ(0, r.status) << r.out;
  EXPECT_NE(std::string::npos, r.out.find("result=2\n")) << r.out;  // ncclSystemError
  EXPECT_NE(std::string::npos, r.out.find("group=2\n")) << r.out;
  EXPECT_NE(std::string::npos, r.out.find("no NCCL library is loaded")) << r.out;
}

}  // namespace
