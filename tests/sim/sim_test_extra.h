// Helpers for the stream, clock and kernel tests of the simulator.
//
// run_isolated() runs a test body in a fresh process: a GoogleTest death-test
// child in "threadsafe" style, which re-executes this binary for the current
// test only. So SIMCUDA_* settings take effect at the child's cuInit, and a
// sticky context error or a busy engine cannot leak into other tests, whether
// the tests run one per process (ctest) or all in one (./build/bin/sim_tests).
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest-spi.h>

#include "sim_test_util.h"

namespace simtest {

using EnvList = std::vector<std::pair<const char*, const char*>>;

// Clears every SIMCUDA_* variable except SIMCUDA_LOG (diagnostics only).
inline void clear_simcuda_env() {
  std::vector<std::string> names;
  for (char** e = environ; e && *e; ++e) {
    if (std::strncmp(*e, "SIMCUDA_", 8) != 0) continue;
    std::string name(*e, std::strcspn(*e, "="));
    if (name != "SIMCUDA_LOG") names.push_back(name);
  }
  for (const std::string& n : names) unsetenv(n.c_str());
}

// Runs `body` in a child process with only `env` set among SIMCUDA_*; the
// test fails if the body records a failure or the child dies otherwise. The
// child's failures are printed on its stderr, which the parent reports.
template <class Body>
void run_isolated(const EnvList& env, Body&& body) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        clear_simcuda_env();
        for (const auto& [k, v] : env) setenv(k, v, 1);
        // A death-test child does not print its results: collect them
        // (from every thread, stream workers included) and print them.
        ::testing::TestPartResultArray results;
        {
          ::testing::ScopedFakeTestPartResultReporter reporter(
              ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ALL_THREADS, &results);
          body();
        }
        int failures = 0;
        for (int i = 0; i < results.size(); ++i) {
          const ::testing::TestPartResult& r = results.GetTestPartResult(i);
          if (!r.failed()) continue;
          ++failures;
          std::fprintf(stderr, "%s:%d: Failure\n%s\n", r.file_name() ? r.file_name() : "?",
                       r.line_number(), r.message());
        }
        std::fflush(stdout);
        std::fflush(stderr);
        // _Exit: stream workers are detached and may still be parked.
        std::_Exit(failures ? 1 : 0);
      },
      ::testing::ExitedWithCode(0), "");
}

// Waits for all work of the current context and moves this thread's virtual
// clock past everything placed on the device: every engine is idle "now".
inline void quiesce() {
  EXPECT_CU(cuCtxSynchronize());
  uint64_t idle = simcuda_device_idle_at_ns(0), now = simcuda_now_ns();
  if (idle > now) simcuda_host_advance_ns(idle - now);
}

// Polls `cond` for up to `limit` of real time (a guard against hangs, not a
// timing assertion). Returns cond().
template <class Cond>
bool wait_until(Cond&& cond, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return cond();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

// Two parties that each arrive and wait (bounded) for the other: both return
// true only if they were running at the same time.
struct Rendezvous {
  std::atomic<int> arrived{0};
  bool arrive() {
    arrived.fetch_add(1);
    return wait_until([&] { return arrived.load() >= 2; });
  }
};

// A one-shot gate a host function or kernel can wait on (bounded).
struct Gate {
  std::atomic<bool> open{false};
  bool wait() {
    return wait_until([&] { return open.load(); });
  }
};

// A kernel with no parameters that does nothing and declares `duration_ns`.
inline CUfunction nop_kernel(uint64_t duration_ns) {
  simcuda_kernel_desc d{};
  d.name = "nop_kernel";
  d.fn = [](const void*, size_t, const simcuda_launch_info*, void*) {};
  d.duration_ns = duration_ns;
  CUfunction f = nullptr;
  EXPECT_CU(simcuda_register_function(&d, &f));
  return f;
}

// A kernel whose single parameter is a std::function<void()>* it calls.
inline CUfunction call_kernel(uint64_t duration_ns = 1000) {
  static const size_t sizes[] = {8};
  simcuda_kernel_desc d{};
  d.name = "call_kernel";
  d.fn = [](const void* params, size_t, const simcuda_launch_info*, void*) {
    std::function<void()>* fn;
    std::memcpy(&fn, params, sizeof fn);
    (*fn)();
  };
  d.param_sizes = sizes;
  d.num_params = 1;
  d.duration_ns = duration_ns;
  CUfunction f = nullptr;
  EXPECT_CU(simcuda_register_function(&d, &f));
  return f;
}

inline CUresult launch_call(CUfunction call, CUstream s, std::function<void()>* fn) {
  void* params[] = {&fn};
  return launch(call, s, params);
}

// cuLaunchHostFunc with a std::function<void()> (which must outlive the call).
inline CUresult host_call(CUstream s, std::function<void()>* fn) {
  return cuLaunchHostFunc(
      s, [](void* p) { (*static_cast<std::function<void()>*>(p))(); }, fn);
}

// Virtual nanoseconds between two completed events.
inline double elapsed_ns(CUevent a, CUevent b) {
  float ms = -1;
  EXPECT_CU(cuEventElapsedTime_v2(&ms, a, b));
  return static_cast<double>(ms) * 1e6;
}

// Makes `streams` wait for a kernel of `hold_ns` on a private stream, so the
// work queued on them next starts at one virtual instant T (the kernel's end,
// far beyond the host's clock while the test enqueues). An event recorded on
// one of them right after the gate reads T.
inline void gate(std::initializer_list<CUstream> streams, uint64_t hold_ns = 10'000'000) {
  CUstream g = nullptr;
  CUevent ev = nullptr;
  EXPECT_CU(cuStreamCreate(&g, CU_STREAM_NON_BLOCKING));
  EXPECT_CU(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  EXPECT_CU(launch(nop_kernel(hold_ns), g, nullptr));
  EXPECT_CU(cuEventRecord(ev, g));
  for (CUstream s : streams) EXPECT_CU(cuStreamWaitEvent(s, ev, 0));
  EXPECT_CU(cuEventDestroy_v2(ev));
  EXPECT_CU(cuStreamDestroy_v2(g));
}

}  // namespace simtest
