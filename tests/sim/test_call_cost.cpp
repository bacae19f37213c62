// Per-entry-point host costs: SIMCUDA_CALL_NS=name:ns,... and the shorthand
// SIMCUDA_VMM_NS (docs/sim.md, "Configuration" and "Virtual clock"). A call
// costs the calling thread's virtual clock exactly its configured cost (the
// calls measured here wait for no device work), an entry point no variable
// names keeps SIMCUDA_API_NS (SIMCUDA_LAUNCH_NS for launches), and a bad
// value or an unknown name makes cuInit fail naming the variable.
//
// Each test runs in its own process (run_isolated): the variables are read
// once, at cuInit.
#include <string>
#include <thread>
#include <vector>

#include "sim_test_extra.h"
#include "variants.h"

using namespace simtest;

namespace {

// The virtual time `call` costs the calling thread.
template <class Call>
uint64_t cost_of(Call&& call) {
  const uint64_t t0 = simcuda_now_ns();
  EXPECT_CU(call());
  return simcuda_now_ns() - t0;
}

CUmemAccessDesc read_write() {
  CUmemAccessDesc acc{};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = 0;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return acc;
}

// cuInit with `env` set is refused; stderr names the variable, the value
// and the accepted forms.
void expect_refused(const EnvList& env, const std::string& variable, const std::string& value) {
  run_isolated(env, [&] {
    testing::internal::CaptureStderr();
    const CUresult r = cuInit(0);
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, r);
    EXPECT_NE(std::string::npos, err.find(variable + "='" + value)) << "stderr: " << err;
    EXPECT_NE(std::string::npos, err.find("accepted:")) << "stderr: " << err;
    // The failure is final: nothing is initialized.
    int n = 0;
    EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED, cuDeviceGetCount(&n));
  });
}

}  // namespace

// SIMCUDA_VMM_NS sets the five VMM calls; a SIMCUDA_CALL_NS item wins over
// it (cuMemSetAccess); other calls keep SIMCUDA_API_NS / SIMCUDA_LAUNCH_NS.
TEST(SimCallCost, VmmShorthandAndOverrides) {
  run_isolated({{"SIMCUDA_API_NS", "500"},
                {"SIMCUDA_LAUNCH_NS", "4000"},
                {"SIMCUDA_VMM_NS", "20us"},
                {"SIMCUDA_CALL_NS", "cuMemSetAccess:7000"}},
               [] {
                 init_primary();
                 const size_t g = granularity();
                 const CUmemAllocationProp prop = device_prop();
                 CUdeviceptr va = 0;
                 CUmemGenericAllocationHandle h = 0;
                 const CUmemAccessDesc acc = read_write();
                 EXPECT_EQ(500u, cost_of([&] { return cuMemAddressReserve(&va, g, 0, 0, 0); }));
                 EXPECT_EQ(20000u, cost_of([&] { return cuMemCreate(&h, g, &prop, 0); }));
                 EXPECT_EQ(20000u, cost_of([&] { return cuMemMap(va, g, 0, h, 0); }));
                 EXPECT_EQ(7000u, cost_of([&] { return cuMemSetAccess(va, g, &acc, 1); }));
                 unsigned long long flags = 0;
                 CUmemLocation loc{CU_MEM_LOCATION_TYPE_DEVICE, 0};
                 EXPECT_EQ(500u, cost_of([&] { return cuMemGetAccess(&flags, &loc, va); }));
                 EXPECT_EQ(20000u, cost_of([&] { return cuMemUnmap(va, g); }));
                 EXPECT_EQ(20000u, cost_of([&] { return cuMemRelease(h); }));
                 EXPECT_EQ(500u, cost_of([&] { return cuMemAddressFree(va, g); }));
                 // What the replayer's ideal charges a swap reads the same.
                 EXPECT_EQ(20000u, simcuda_call_cost_ns("cuMemMap"));
                 EXPECT_EQ(7000u, simcuda_call_cost_ns("cuMemSetAccess"));
                 EXPECT_EQ(500u, simcuda_call_cost_ns("cuMemGetAccess"));
                 CUfunction k = nop_kernel(1000);
                 EXPECT_EQ(4000u, cost_of([&] {
                             return cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr,
                                                   nullptr);
                           }));
                 EXPECT_CU(cuCtxSynchronize());
               });
}

// A base name covers every version and per-thread variant; an exported name
// only itself. A launch can be given its own cost too.
TEST(SimCallCost, BaseAndExportedNames) {
  run_isolated(
      {{"SIMCUDA_CALL_NS", "cuStreamQuery:1234,cuStreamGetId_ptsz:900,cuLaunchKernel:2us"}}, [] {
        init_primary();
        CUstream s = nullptr;
        ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        EXPECT_EQ(1234u, cost_of([&] { return cuStreamQuery(s); }));
        EXPECT_EQ(1234u, cost_of([&] { return cuStreamQuery_ptsz(s); }));
        unsigned long long id = 0;
        EXPECT_EQ(900u, cost_of([&] { return cuStreamGetId_ptsz(s, &id); }));
        EXPECT_EQ(500u, cost_of([&] { return cuStreamGetId(s, &id); }));
        CUfunction k = nop_kernel(1000);
        EXPECT_EQ(2000u, cost_of([&] {
                    return cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, nullptr, nullptr);
                  }));
        EXPECT_EQ(2000u, cost_of([&] {
                    return cuLaunchKernel_ptsz(k, 1, 1, 1, 1, 1, 1, 0, s, nullptr, nullptr);
                  }));
        // Not named: the launch default.
        EXPECT_EQ(4000u, cost_of([&] {
                    return cuLaunchCooperativeKernel(k, 1, 1, 1, 1, 1, 1, 0, s, nullptr);
                  }));
        EXPECT_CU(cuStreamSynchronize(s));
        EXPECT_CU(cuStreamDestroy_v2(s));
      });
}

// A later item wins over an earlier one for the entry points both name.
TEST(SimCallCost, LaterItemWins) {
  run_isolated(
      {{"SIMCUDA_VMM_NS", "3000"}, {"SIMCUDA_CALL_NS", "cuMemCreate:1ms,cuMemCreate:9000"}}, [] {
        init_primary();
        const size_t g = granularity();
        const CUmemAllocationProp prop = device_prop();
        CUmemGenericAllocationHandle h = 0;
        EXPECT_EQ(9000u, cost_of([&] { return cuMemCreate(&h, g, &prop, 0); }));
        EXPECT_EQ(3000u, cost_of([&] { return cuMemRelease(h); }));
      });
}

TEST(SimCallCost, RefusesUnknownEntryPoint) {
  expect_refused({{"SIMCUDA_CALL_NS", "cuMemMap:20us,cuMemMapp:20us"}}, "SIMCUDA_CALL_NS",
                 "cuMemMap:20us,cuMemMapp:20us");
  // A table base name that is not the base of its export
  // (cuGraphInstantiate -> cuGraphInstantiateWithFlags) would match nothing.
  expect_refused({{"SIMCUDA_CALL_NS", "cuGraphInstantiate:1000"}}, "SIMCUDA_CALL_NS",
                 "cuGraphInstantiate:1000");
}

TEST(SimCallCost, RefusesBadValues) {
  expect_refused({{"SIMCUDA_CALL_NS", "cuMemMap:20parsecs"}}, "SIMCUDA_CALL_NS",
                 "cuMemMap:20parsecs");
  expect_refused({{"SIMCUDA_CALL_NS", "cuMemMap"}}, "SIMCUDA_CALL_NS", "cuMemMap");
  expect_refused({{"SIMCUDA_CALL_NS", "cuMemMap:-5"}}, "SIMCUDA_CALL_NS", "cuMemMap:-5");
  expect_refused({{"SIMCUDA_CALL_NS", "cuMemMap:1us,"}}, "SIMCUDA_CALL_NS", "cuMemMap:1us,");
  expect_refused({{"SIMCUDA_VMM_NS", "fast"}}, "SIMCUDA_VMM_NS", "fast");
  expect_refused({{"SIMCUDA_VMM_NS", "2s"}}, "SIMCUDA_VMM_NS", "2s");
}

// SIMCUDA_HOST_CREATE_GBPS: creating host-located memory costs its size at
// that rate on top of the call's own cost; device memory does not (an H200
// created host memory at 3.2 GB/s and device memory at a fixed cost, docs/gpu.md).
TEST(SimCallCost, HostMemoryCreationCostsByTheByte) {
  run_isolated({{"SIMCUDA_VMM_NS", "20us"}, {"SIMCUDA_HOST_CREATE_GBPS", "2"}}, [] {
    init_primary();
    const size_t g = granularity();
    const CUmemAllocationProp dprop = device_prop();
    const CUmemAllocationProp hprop = host_prop();
    CUmemGenericAllocationHandle d = 0, h = 0, h4 = 0;
    EXPECT_EQ(20000u, cost_of([&] { return cuMemCreate(&d, g, &dprop, 0); }));
    EXPECT_EQ(20000u + g / 2, cost_of([&] { return cuMemCreate(&h, g, &hprop, 0); }));
    EXPECT_EQ(20000u + 4 * g / 2, cost_of([&] { return cuMemCreate(&h4, 4 * g, &hprop, 0); }));
    EXPECT_EQ(20000u, cost_of([&] { return cuMemRelease(h4); }));
    EXPECT_CU(cuMemRelease(h));
    EXPECT_CU(cuMemRelease(d));
  });
}

TEST(SimCallCost, RefusesABadHostCreationRate) {
  run_isolated({{"SIMCUDA_HOST_CREATE_GBPS", "0"}}, [] {
    testing::internal::CaptureStderr();
    EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuInit(0));
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_NE(std::string::npos, err.find("SIMCUDA_HOST_CREATE_GBPS")) << err;
  });
}

// A handle created on one thread and mapped on another: the mapping thread's
// clock moves to the creating thread's once cuMemCreate returned (docs/sim.md,
// "Handing physical memory between threads").
TEST(SimCallCost, AHandleIsMappedNoEarlierThanItWasCreated) {
  run_isolated({{"SIMCUDA_HOST_CREATE_GBPS", "1"}}, [] {
    init_primary();
    const size_t g = granularity();
    const CUmemAllocationProp hprop = host_prop();
    CUmemGenericAllocationHandle h = 0;
    uint64_t created_at = 0;
    CUcontext ctx = nullptr;
    ASSERT_CU(cuCtxGetCurrent(&ctx));
    std::thread maker([&] {
      EXPECT_CU(cuCtxSetCurrent(ctx));
      simcuda_host_advance_ns(5'000'000);
      EXPECT_CU(cuMemCreate(&h, 4 * g, &hprop, 0));
      created_at = simcuda_now_ns();
    });
    maker.join();
    ASSERT_GE(created_at, 5'000'000u + 4 * g);
    CUdeviceptr va = 0;
    ASSERT_CU(cuMemAddressReserve(&va, 4 * g, 0, 0, 0));
    EXPECT_LT(simcuda_now_ns(), created_at);
    ASSERT_CU(cuMemMap(va, 4 * g, 0, h, 0));
    EXPECT_GE(simcuda_now_ns(), created_at);
    EXPECT_CU(cuMemUnmap(va, 4 * g));
    EXPECT_CU(cuMemAddressFree(va, 4 * g));
    EXPECT_CU(cuMemRelease(h));
  });
}

// Host memory creation holds the driver's VMM calls: on an H200 a device
// create, map, set access, unmap or release on one thread waited for a host
// cuMemCreate on another to end, launches and events did not, and creations
// on several threads went no faster than on one (docs/gpu.md, check (f)).
TEST(SimCallCost, AHostCreationHoldsUpEveryVmmCallOfOtherThreadsButNothingElse) {
  run_isolated({{"SIMCUDA_VMM_NS", "20us"}, {"SIMCUDA_HOST_CREATE_GBPS", "1"}}, [] {
    init_primary();
    const size_t g = granularity();
    const CUmemAllocationProp hprop = host_prop();
    const CUmemAllocationProp dprop = device_prop();
    CUcontext ctx = nullptr;
    ASSERT_CU(cuCtxGetCurrent(&ctx));
    CUdeviceptr va = 0;
    ASSERT_CU(cuMemAddressReserve(&va, 2 * g, 0, 0, 0));
    CUmemGenericAllocationHandle mapped = 0, h = 0, d = 0, h2 = 0;
    ASSERT_CU(cuMemCreate(&mapped, g, &dprop, 0));
    ASSERT_CU(cuMemMap(va, g, 0, mapped, 0));
    CUevent e = nullptr;
    ASSERT_CU(cuEventCreate(&e, CU_EVENT_DEFAULT));
    uint64_t start = 0, end = 0;
    std::thread maker([&] {
      EXPECT_CU(cuCtxSetCurrent(ctx));
      start = simcuda_now_ns();
      EXPECT_CU(cuMemCreate(&h, 64 * g, &hprop, 0));
      end = simcuda_now_ns();
    });
    maker.join();
    ASSERT_GE(end, start + 64 * g);  // 1 byte per ns
    // This thread's clock a little after the creation began (a new thread's
    // clock starts at the latest any thread reached, docs/sim.md).
    if (simcuda_now_ns() < start + 1000) simcuda_host_advance_ns(start + 1000 - simcuda_now_ns());
    // Not a VMM call: not held up.
    ASSERT_LT(simcuda_now_ns(), end);
    EXPECT_CU(cuEventRecord(e, nullptr));
    EXPECT_LT(simcuda_now_ns(), end);
    // Each VMM call whose start falls inside the creation waits for its end.
    const CUmemAccessDesc acc = read_write();
    EXPECT_CU(cuMemSetAccess(va, g, &acc, 1));
    EXPECT_GE(simcuda_now_ns(), end);
    // A second creation starts after the first one's end, whatever the
    // thread's clock said, and takes its own time.
    ASSERT_CU(cuMemCreate(&d, g, &dprop, 0));
    ASSERT_CU(cuMemCreate(&h2, g, &hprop, 0));
    EXPECT_GE(simcuda_now_ns(), end + g);
    EXPECT_CU(cuMemUnmap(va, g));
    EXPECT_CU(cuMemAddressFree(va, 2 * g));
    for (CUmemGenericAllocationHandle x : {mapped, h, d, h2}) EXPECT_CU(cuMemRelease(x));
    EXPECT_CU(cuEventDestroy(e));
  });
}

// The same calls on a thread whose clock is past every creation wait for
// nothing: only a call that would run during a creation is held.
TEST(SimCallCost, AVmmCallAfterEveryCreationWaitsForNone) {
  run_isolated({{"SIMCUDA_VMM_NS", "20us"}, {"SIMCUDA_HOST_CREATE_GBPS", "1"}}, [] {
    init_primary();
    const size_t g = granularity();
    const CUmemAllocationProp hprop = host_prop();
    const CUmemAllocationProp dprop = device_prop();
    CUmemGenericAllocationHandle h = 0, d = 0;
    ASSERT_CU(cuMemCreate(&h, 8 * g, &hprop, 0));
    EXPECT_EQ(20000u, cost_of([&] { return cuMemCreate(&d, g, &dprop, 0); }));
    EXPECT_EQ(20000u, cost_of([&] { return cuMemRelease(d); }));
    EXPECT_CU(cuMemRelease(h));
  });
}

// The driver makes device VMM calls one at a time, whatever the threads
// (docs/gpu.md run 19). Another thread's three calls take [T, T + 30 us)
// and [T + 50, T + 60 us): this thread's call at T waits for the three (a
// call that is not a VMM call does not), and one at T + 41 us, which would
// overlap the later one, goes after it.
TEST(SimCallCost, VmmCallsOfAllThreadsAreOneAtATime) {
  run_isolated({{"SIMCUDA_VMM_NS", "10us"}}, [] {
    init_primary();
    const CUmemAllocationProp dprop = device_prop();
    const size_t g = granularity();
    CUcontext ctx = nullptr;
    ASSERT_CU(cuCtxGetCurrent(&ctx));
    const uint64_t T = simcuda_now_ns() + 1000;
    auto advance_to = [](uint64_t t) {
      ASSERT_LE(simcuda_now_ns(), t);
      simcuda_host_advance_ns(t - simcuda_now_ns());
    };
    std::vector<CUmemGenericAllocationHandle> hs(6, 0);
    std::thread other([&] {
      EXPECT_CU(cuCtxSetCurrent(ctx));
      advance_to(T);
      for (int i = 0; i < 3; ++i) EXPECT_CU(cuMemCreate(&hs[i], g, &dprop, 0));
      EXPECT_EQ(T + 30000, simcuda_now_ns());
      advance_to(T + 50000);
      EXPECT_CU(cuMemCreate(&hs[3], g, &dprop, 0));
    });
    other.join();
    advance_to(T);
    CUevent e = nullptr;
    ASSERT_CU(cuEventCreate(&e, CU_EVENT_DEFAULT));
    EXPECT_EQ(T + 500, simcuda_now_ns());
    ASSERT_CU(cuMemCreate(&hs[4], g, &dprop, 0));
    EXPECT_EQ(T + 40000, simcuda_now_ns());
    advance_to(T + 41000);
    ASSERT_CU(cuMemCreate(&hs[5], g, &dprop, 0));
    EXPECT_EQ(T + 70000, simcuda_now_ns());
    for (CUmemGenericAllocationHandle h : hs) EXPECT_CU(cuMemRelease(h));
    EXPECT_CU(cuEventDestroy(e));
  });
}
