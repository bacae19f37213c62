// Stream capture and graphs: captured work does not run, a graph launch
// replays it with the arguments of capture time, misuse is refused as cuda.h
// describes (docs/sim.md, "Stream capture and graphs").
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "sim_test_extra.h"
#include "variants.h"

using namespace simtest;

namespace {

// A kernel that stores a uint32 at a device address and counts its runs.
struct StoreKernel {
  std::atomic<int> runs{0};
  CUfunction f = nullptr;
  explicit StoreKernel(uint64_t duration_ns = 1000) {
    static const size_t sizes[] = {8, 4};
    simcuda_kernel_desc d{};
    d.name = "store_kernel";
    d.fn = [](const void* p, size_t, const simcuda_launch_info*, void* user) {
      uint64_t addr;
      uint32_t value;
      std::memcpy(&addr, p, 8);
      std::memcpy(&value, static_cast<const char*>(p) + 8, 4);
      *reinterpret_cast<volatile uint32_t*>(addr) = value;
      static_cast<StoreKernel*>(user)->runs.fetch_add(1);
    };
    d.user = this;
    d.param_sizes = sizes;
    d.num_params = 2;
    d.duration_ns = duration_ns;
    EXPECT_CU(simcuda_register_function(&d, &f));
  }
  CUresult launch(CUstream s, CUdeviceptr at, uint32_t value) {
    void* params[] = {&at, &value};
    return simtest::launch(f, s, params);
  }
};

uint32_t read_u32(CUdeviceptr p) {
  uint32_t v = 0;
  EXPECT_CU(cuMemcpyDtoH_v2(&v, p, sizeof v));
  return v;
}

CUstream new_stream(unsigned flags = 0) {
  CUstream s = nullptr;
  EXPECT_CU(cuStreamCreate(&s, flags));
  return s;
}

CUstreamCaptureStatus status_of(CUstream s) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  EXPECT_CU(cuStreamIsCapturing(s, &st));
  return st;
}

}  // namespace

// Kernel, memset and copy captured once, replayed twice: each replay runs
// them in order with the argument values of capture time; nothing runs
// during capture.
TEST(SimGraph, CaptureThenLaunchTwiceReplaysCapturedArguments) {
  init_primary();
  VmmBlock b;
  ASSERT_CU(map_block(&b, granularity(), device_prop()));
  ASSERT_CU(cuMemsetD8_v2(b.ptr, 0, 256));
  CUstream s = new_stream();
  StoreKernel k;

  ASSERT_CU(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUdeviceptr at = b.ptr;
  uint32_t value = 7;
  void* params[] = {&at, &value};
  ASSERT_CU(launch(k.f, s, params));
  value = 9;  // kernelParams are copied when the launch is made
  at = b.ptr + 4;
  ASSERT_CU(cuMemsetD32Async(b.ptr + 64, 0xABCD1234u, 1, s));
  ASSERT_CU(cuMemcpyDtoDAsync_v2(b.ptr + 128, b.ptr, 4, s));
  CUgraph g = nullptr;
  ASSERT_CU(cuStreamEndCapture(s, &g));
  ASSERT_NE(nullptr, g);

  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(0, k.runs.load()) << "captured work must not run";
  EXPECT_EQ(0u, read_u32(b.ptr));
  EXPECT_EQ(0u, read_u32(b.ptr + 64));

  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiateWithFlags(&exec, g, 0));
  for (int round = 1; round <= 2; ++round) {
    ASSERT_CU(cuMemsetD8_v2(b.ptr, 0, 256));
    ASSERT_CU(cuGraphLaunch(exec, s));
    ASSERT_CU(cuStreamSynchronize(s));
    EXPECT_EQ(round, k.runs.load());
    EXPECT_EQ(7u, read_u32(b.ptr)) << "round " << round;
    EXPECT_EQ(0u, read_u32(b.ptr + 4)) << "the later argument values must not be used";
    EXPECT_EQ(0xABCD1234u, read_u32(b.ptr + 64)) << "memset node";
    EXPECT_EQ(7u, read_u32(b.ptr + 128)) << "copy node ran after the kernel";
  }
  EXPECT_CU(cuGraphExecDestroy(exec));
  EXPECT_CU(cuGraphDestroy(g));
  EXPECT_CU(cuStreamDestroy_v2(s));
  unmap_block(b);
}

// The per-thread entry points and cuGetProcAddress reach the same code.
TEST(SimGraph, PerThreadVariantsAndProcAddress) {
  init_primary();
  void* fn = nullptr;
  CUdriverProcAddressQueryResult q{};
  ASSERT_CU(cuGetProcAddress_v2("cuStreamBeginCapture", &fn, 13000, 0, &q));
  EXPECT_EQ(reinterpret_cast<void*>(&cuStreamBeginCapture_v2), fn);
  ASSERT_CU(cuGetProcAddress_v2("cuStreamBeginCapture", &fn, 13000,
                                CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &q));
  EXPECT_EQ(reinterpret_cast<void*>(&cuStreamBeginCapture_v2_ptsz), fn);
  ASSERT_CU(cuGetProcAddress_v2("cuGraphInstantiate", &fn, 13000, 0, &q));
  EXPECT_EQ(reinterpret_cast<void*>(&cuGraphInstantiateWithFlags), fn);
  ASSERT_CU(cuGetProcAddress_v2("cuStreamGetCaptureInfo", &fn, 13000, 0, &q));
  EXPECT_EQ(reinterpret_cast<void*>(&cuStreamGetCaptureInfo_v3), fn);
  ASSERT_CU(cuGetProcAddress_v2("cuGraphLaunch", &fn, 13000,
                                CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &q));
  EXPECT_EQ(reinterpret_cast<void*>(&cuGraphLaunch_ptsz), fn);

  // Capture on the per-thread default stream through the _ptsz entry points.
  VmmBlock b;
  ASSERT_CU(map_block(&b, granularity(), device_prop()));
  StoreKernel k;
  ASSERT_CU(cuStreamBeginCapture_v2_ptsz(nullptr, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  CUstreamCaptureStatus st{};
  ASSERT_CU(cuStreamIsCapturing_ptsz(nullptr, &st));
  EXPECT_EQ(CU_STREAM_CAPTURE_STATUS_ACTIVE, st);
  ASSERT_CU(k.launch(CU_STREAM_PER_THREAD, b.ptr, 5));
  CUgraph g = nullptr;
  ASSERT_CU(cuStreamEndCapture_ptsz(nullptr, &g));
  CUgraphExec e = nullptr;
  ASSERT_CU(cuGraphInstantiateWithFlags(&e, g, 0));
  ASSERT_CU(cuGraphLaunch_ptsz(e, nullptr));
  ASSERT_CU(cuStreamSynchronize_ptsz(nullptr));
  EXPECT_EQ(1, k.runs.load());
  EXPECT_EQ(5u, read_u32(b.ptr));
  EXPECT_CU(cuGraphExecDestroy(e));
  EXPECT_CU(cuGraphDestroy(g));
  unmap_block(b);
}

// Capture status and ids; the graph reported during capture is the one
// returned by cuStreamEndCapture.
TEST(SimGraph, CaptureInfoReportsStatusIdAndGraph) {
  init_primary();
  CUstream s = new_stream();
  EXPECT_EQ(CU_STREAM_CAPTURE_STATUS_NONE, status_of(s));
  CUstreamCaptureStatus st{};
  cuuint64_t id = 0;
  CUgraph during = nullptr;
  ASSERT_CU(cuStreamGetCaptureInfo_v3(s, &st, &id, &during, nullptr, nullptr, nullptr));
  EXPECT_EQ(CU_STREAM_CAPTURE_STATUS_NONE, st);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuStreamGetCaptureInfo_v3(s, nullptr, &id, nullptr, nullptr, nullptr, nullptr))
      << "captureStatus_out is required";

  ASSERT_CU(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuStreamGetCaptureInfo_v3(s, &st, &id, &during, nullptr, nullptr, nullptr));
  EXPECT_EQ(CU_STREAM_CAPTURE_STATUS_ACTIVE, st);
  EXPECT_NE(0u, id);
  EXPECT_NE(nullptr, during);
  // The legacy stream while a blocking stream captures (cuda.h,
  // cuStreamIsCapturing): IMPLICIT, and the capture is not invalidated.
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, cuStreamIsCapturing(CU_STREAM_LEGACY, &st));
  EXPECT_EQ(CU_STREAM_CAPTURE_STATUS_ACTIVE, status_of(s));
  CUgraph g = nullptr;
  ASSERT_CU(cuStreamEndCapture(s, &g));
  EXPECT_EQ(during, g);
  EXPECT_EQ(CU_STREAM_CAPTURE_STATUS_NONE, status_of(s));

  cuuint64_t id2 = 0;
  ASSERT_CU(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  ASSERT_CU(cuStreamGetCaptureInfo_v3(s, &st, &id2, nullptr, nullptr, nullptr, nullptr));
  EXPECT_NE(id, id2) << "capture ids are unique";
  CUgraph g2 = nullptr;
  ASSERT_CU(cuStreamEndCapture(s, &g2));
  EXPECT_NE(g, g2);

  // A non-blocking stream's capture leaves the legacy stream usable.
  CUstream nb = new_stream(CU_STREAM_NON_BLOCKING);
  ASSERT_CU(cuStreamBeginCapture_v2(nb, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_EQ(CU_STREAM_CAPTURE_STATUS_NONE, status_of(CU_STREAM_LEGACY));
  CUgraph g3 = nullptr;
  ASSERT_CU(cuStreamEndCapture(nb, &g3));
  for (CUgraph x : {g, g2, g3}) EXPECT_CU(cuGraphDestroy(x));
  EXPECT_CU(cuStreamDestroy_v2(nb));
  EXPECT_CU(cuStreamDestroy_v2(s));
}

// Destroyed graphs and executable graphs are refused (cuda.h lists
// CUDA_ERROR_INVALID_VALUE for these calls), and handles are never reused.
TEST(SimGraph, DestroyedHandlesAreRefused) {
  init_primary();
  CUstream s = new_stream();
  CUfunction nop = nop_kernel(1000);
  ASSERT_CU(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(launch(nop, s, nullptr));
  CUgraph g = nullptr;
  ASSERT_CU(cuStreamEndCapture(s, &g));
  CUgraphExec e = nullptr;
  ASSERT_CU(cuGraphInstantiateWithFlags(&e, g, 0));
  EXPECT_CU(cuGraphDestroy(g));
  // cuda.h: the executable graph does not depend on the graph it came from.
  EXPECT_CU(cuGraphLaunch(e, s));
  EXPECT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuGraphDestroy(g));
  CUgraphExec e2 = nullptr;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuGraphInstantiateWithFlags(&e2, g, 0));
  EXPECT_CU(cuGraphExecDestroy(e));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuGraphExecDestroy(e));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuGraphLaunch(e, s));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuGraphLaunch(nullptr, s));

  ASSERT_CU(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUgraph g2 = nullptr;
  // "All operations other than destroy and node removal are permitted on the
  // graph while the capture sequence is in progress" (cuStreamGetCaptureInfo).
  CUstreamCaptureStatus st{};
  ASSERT_CU(cuStreamGetCaptureInfo_v3(s, &st, nullptr, &g2, nullptr, nullptr, nullptr));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuGraphDestroy(g2));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuGraphInstantiateWithFlags(&e2, g2, 0))
      << "not instantiable until cuStreamEndCapture";
  ASSERT_CU(cuStreamEndCapture(s, &g2));
  EXPECT_NE(g, g2) << "handles are never reused";
  ASSERT_CU(cuGraphInstantiateWithFlags(&e2, g2, 0));
  EXPECT_NE(e, e2);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuGraphInstantiateWithFlags(&e2, g2, CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH));
  EXPECT_CU(cuGraphExecDestroy(e2));
  EXPECT_CU(cuGraphDestroy(g2));
  EXPECT_CU(cuStreamDestroy_v2(s));
}

// Begin/end misuse.
TEST(SimGraph, BeginAndEndMisuse) {
  init_primary();
  CUstream s = new_stream();
  CUgraph g = nullptr;
  EXPECT_EQ(CUDA_ERROR_ILLEGAL_STATE, cuStreamEndCapture(s, &g)) << "not capturing";
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            cuStreamBeginCapture_v2(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_EQ(CUDA_ERROR_ILLEGAL_STATE, cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuStreamEndCapture(s, nullptr));
  // cuda.h: outside RELAXED mode, EndCapture "must be from the same thread".
  CUresult other = CUDA_SUCCESS;
  CUcontext ctx = nullptr;
  ASSERT_CU(cuCtxGetCurrent(&ctx));
  std::thread([&] {
    cuCtxSetCurrent(ctx);
    CUgraph tg = nullptr;
    other = cuStreamEndCapture(s, &tg);
  }).join();
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, other);
  ASSERT_CU(cuStreamEndCapture(s, &g));
  EXPECT_CU(cuGraphDestroy(g));
  EXPECT_CU(cuStreamDestroy_v2(s));
}

// Synchronizing or querying a capturing stream is refused and invalidates
// the capture; EndCapture then returns INVALIDATED and a NULL graph, and the
// stream is usable again.
TEST(SimGraph, SyncDuringCaptureIsRefusedAndInvalidates) {
  init_primary();
  VmmBlock b;
  ASSERT_CU(map_block(&b, granularity(), device_prop()));
  StoreKernel k;
  CUstream s = new_stream();
  using SyncFn = CUresult (*)(CUstream);
  for (SyncFn sync : {SyncFn{&cuStreamSynchronize}, SyncFn{&cuStreamQuery}}) {
    ASSERT_CU(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    ASSERT_CU(k.launch(s, b.ptr, 1));
    EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, sync(s));
    EXPECT_EQ(CU_STREAM_CAPTURE_STATUS_INVALIDATED, status_of(s));
    EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, k.launch(s, b.ptr, 2));
    CUgraph g = reinterpret_cast<CUgraph>(0x1);
    EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s, &g));
    EXPECT_EQ(nullptr, g);
    EXPECT_EQ(CU_STREAM_CAPTURE_STATUS_NONE, status_of(s));
  }
  // cuCtxSynchronize with a capturing stream in the context: refused too.
  ASSERT_CU(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuCtxSynchronize());
  EXPECT_EQ(CU_STREAM_CAPTURE_STATUS_INVALIDATED, status_of(s));
  CUgraph g = nullptr;
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s, &g));

  ASSERT_CU(k.launch(s, b.ptr, 3));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(1, k.runs.load()) << "only the launch made after the capture ran";
  EXPECT_EQ(3u, read_u32(b.ptr));
  EXPECT_CU(cuStreamDestroy_v2(s));
  unmap_block(b);
}

// The legacy stream while a blocking stream captures: a synchronous copy
// (which runs on it) is CUDA_ERROR_STREAM_CAPTURE_IMPLICIT and invalidates;
// pageable async copies (the host waits) cannot be captured.
TEST(SimGraph, LegacyStreamUseDuringCaptureIsImplicit) {
  init_primary();
  VmmBlock b;
  ASSERT_CU(map_block(&b, granularity(), device_prop()));
  CUstream s = new_stream();
  std::vector<uint32_t> host(16, 5);
  ASSERT_CU(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, cuMemcpyHtoD_v2(b.ptr, host.data(), 64));
  EXPECT_EQ(CU_STREAM_CAPTURE_STATUS_INVALIDATED, status_of(s));
  CUgraph g = nullptr;
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s, &g));

  ASSERT_CU(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuMemcpyHtoDAsync_v2(b.ptr, host.data(), 64, s))
      << "pageable source: the host would wait for captured work";
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s, &g));
  EXPECT_EQ(0u, read_u32(b.ptr)) << "nothing was copied";
  EXPECT_CU(cuStreamDestroy_v2(s));
  unmap_block(b);
}

// cuThreadExchangeStreamCaptureMode: a "potentially unsafe" call (cuMemAlloc)
// is refused while this thread captures in GLOBAL or THREAD_LOCAL mode, or
// while another thread captures in GLOBAL mode and this thread's mode is
// GLOBAL; RELAXED allows it.
TEST(SimGraph, CaptureModesGovernUnsafeCalls) {
  init_primary();
  CUstream s = new_stream(CU_STREAM_NON_BLOCKING);
  CUdeviceptr d = 0;
  ASSERT_CU(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuMemAlloc_v2(&d, 4096));
  EXPECT_EQ(CU_STREAM_CAPTURE_STATUS_INVALIDATED, status_of(s));
  CUgraph g = nullptr;
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s, &g));

  ASSERT_CU(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  ASSERT_CU(cuMemAlloc_v2(&d, 4096)) << "a RELAXED capture does not prohibit it";
  ASSERT_CU(cuMemFree_v2(d));
  ASSERT_CU(cuStreamEndCapture(s, &g));
  EXPECT_CU(cuGraphDestroy(g));

  ASSERT_CU(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  ASSERT_CU(cuThreadExchangeStreamCaptureMode(&mode));
  EXPECT_EQ(CU_STREAM_CAPTURE_MODE_GLOBAL, mode) << "the default mode";
  ASSERT_CU(cuMemAlloc_v2(&d, 4096)) << "this thread is RELAXED";
  ASSERT_CU(cuMemFree_v2(d));
  ASSERT_CU(cuThreadExchangeStreamCaptureMode(&mode));
  EXPECT_EQ(CU_STREAM_CAPTURE_MODE_RELAXED, mode);

  // Another thread, mode GLOBAL: prohibited only by GLOBAL captures elsewhere.
  CUcontext ctx = nullptr;
  ASSERT_CU(cuCtxGetCurrent(&ctx));
  CUresult r = CUDA_ERROR_UNKNOWN;
  std::thread([&] {
    cuCtxSetCurrent(ctx);
    CUdeviceptr p = 0;
    r = cuMemAlloc_v2(&p, 4096);
    if (r == CUDA_SUCCESS) cuMemFree_v2(p);
  }).join();
  EXPECT_EQ(CUDA_SUCCESS, r) << "a THREAD_LOCAL capture elsewhere does not prohibit it";
  ASSERT_CU(cuStreamEndCapture(s, &g));
  EXPECT_CU(cuGraphDestroy(g));

  ASSERT_CU(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUresult global_r = CUDA_SUCCESS, local_r = CUDA_ERROR_UNKNOWN;
  std::thread([&] {
    cuCtxSetCurrent(ctx);
    CUdeviceptr p = 0;
    global_r = cuMemAlloc_v2(&p, 4096);
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    cuThreadExchangeStreamCaptureMode(&m);
    local_r = cuMemAlloc_v2(&p, 4096);
    if (local_r == CUDA_SUCCESS) cuMemFree_v2(p);
  }).join();
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, global_r);
  EXPECT_EQ(CUDA_SUCCESS, local_r);
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s, &g));
  EXPECT_CU(cuStreamDestroy_v2(s));
}

// A graph launch takes, in virtual time, the sum of its kernels' declared
// durations (they run one after the other on the compute engine).
TEST(SimGraph, LaunchTakesTheSumOfItsKernelDurations) {
  init_primary();
  CUstream s = new_stream(CU_STREAM_NON_BLOCKING);
  CUfunction k1 = nop_kernel(1'000), k2 = nop_kernel(20'000), k3 = nop_kernel(300'000);
  ASSERT_CU(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  for (CUfunction f : {k1, k2, k3}) ASSERT_CU(launch(f, s, nullptr));
  CUgraph g = nullptr;
  ASSERT_CU(cuStreamEndCapture(s, &g));
  CUgraphExec e = nullptr;
  ASSERT_CU(cuGraphInstantiateWithFlags(&e, g, 0));
  quiesce();
  gate({s});  // the graph starts at one instant, far beyond host costs
  CUevent a = nullptr, z = nullptr;
  ASSERT_CU(cuEventCreate(&a, 0));
  ASSERT_CU(cuEventCreate(&z, 0));
  ASSERT_CU(cuEventRecord(a, s));
  ASSERT_CU(cuGraphLaunch(e, s));
  ASSERT_CU(cuEventRecord(z, s));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_NEAR(321'000.0, elapsed_ns(a, z), 1.0);
  // A second launch takes as long again.
  gate({s});
  ASSERT_CU(cuEventRecord(a, s));
  ASSERT_CU(cuGraphLaunch(e, s));
  ASSERT_CU(cuEventRecord(z, s));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_NEAR(321'000.0, elapsed_ns(a, z), 1.0);
  EXPECT_CU(cuEventDestroy_v2(a));
  EXPECT_CU(cuEventDestroy_v2(z));
  EXPECT_CU(cuGraphExecDestroy(e));
  EXPECT_CU(cuGraphDestroy(g));
  EXPECT_CU(cuStreamDestroy_v2(s));
}

// Cross-stream fork/join through events (PyTorch side streams): a stream
// waiting on an event recorded in a capture joins it; its work is part of the
// graph; a fork that is not joined back makes EndCapture fail.
TEST(SimGraph, ForkJoinThroughEvents) {
  init_primary();
  VmmBlock b;
  ASSERT_CU(map_block(&b, granularity(), device_prop()));
  StoreKernel k;
  CUstream s1 = new_stream(), s2 = new_stream();
  CUevent fork = nullptr, join = nullptr;
  ASSERT_CU(cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING));
  ASSERT_CU(cuEventCreate(&join, CU_EVENT_DISABLE_TIMING));

  ASSERT_CU(cuStreamBeginCapture_v2(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(k.launch(s1, b.ptr, 1));
  ASSERT_CU(cuEventRecord(fork, s1));
  EXPECT_EQ(CUDA_ERROR_CAPTURED_EVENT, cuEventQuery(fork));
  ASSERT_CU(cuStreamWaitEvent(s2, fork, 0));
  cuuint64_t id1 = 0, id2 = 0;
  CUstreamCaptureStatus st{};
  ASSERT_CU(cuStreamGetCaptureInfo_v3(s1, &st, &id1, nullptr, nullptr, nullptr, nullptr));
  ASSERT_CU(cuStreamGetCaptureInfo_v3(s2, &st, &id2, nullptr, nullptr, nullptr, nullptr));
  EXPECT_EQ(CU_STREAM_CAPTURE_STATUS_ACTIVE, st);
  EXPECT_EQ(id1, id2) << "s2 joined s1's capture";
  ASSERT_CU(k.launch(s2, b.ptr + 4, 2));
  ASSERT_CU(cuEventRecord(join, s2));
  ASSERT_CU(cuStreamWaitEvent(s1, join, 0));
  CUgraph g = nullptr;
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, cuStreamEndCapture(s2, &g))
      << "capture must be ended on the stream that began it";
  ASSERT_CU(cuStreamEndCapture(s1, &g));
  EXPECT_EQ(CU_STREAM_CAPTURE_STATUS_NONE, status_of(s2)) << "the joined stream left too";
  EXPECT_EQ(0, k.runs.load());
  CUgraphExec e = nullptr;
  ASSERT_CU(cuGraphInstantiateWithFlags(&e, g, 0));
  ASSERT_CU(cuGraphLaunch(e, s1));
  ASSERT_CU(cuStreamSynchronize(s1));
  EXPECT_EQ(2, k.runs.load());
  EXPECT_EQ(1u, read_u32(b.ptr));
  EXPECT_EQ(2u, read_u32(b.ptr + 4));

  // Not joined back.
  ASSERT_CU(cuStreamBeginCapture_v2(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuEventRecord(fork, s1));
  ASSERT_CU(cuStreamWaitEvent(s2, fork, 0));
  ASSERT_CU(k.launch(s2, b.ptr, 3));
  CUgraph bad = reinterpret_cast<CUgraph>(0x1);
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, cuStreamEndCapture(s1, &bad));
  EXPECT_EQ(nullptr, bad);
  EXPECT_EQ(CU_STREAM_CAPTURE_STATUS_NONE, status_of(s2));

  // Waiting in a capture on an event recorded outside it crosses the boundary.
  ASSERT_CU(cuEventRecord(join, s2));
  ASSERT_CU(cuStreamBeginCapture_v2(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, cuStreamWaitEvent(s1, join, 0));
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s1, &bad));
  ASSERT_CU(cuStreamSynchronize(s2));
  EXPECT_EQ(2, k.runs.load());

  EXPECT_CU(cuGraphExecDestroy(e));
  EXPECT_CU(cuGraphDestroy(g));
  EXPECT_CU(cuEventDestroy_v2(fork));
  EXPECT_CU(cuEventDestroy_v2(join));
  EXPECT_CU(cuStreamDestroy_v2(s1));
  EXPECT_CU(cuStreamDestroy_v2(s2));
  unmap_block(b);
}

// A graph's kernel touching an unmapped address: the same sticky
// CUDA_ERROR_ILLEGAL_ADDRESS as any kernel.
TEST(SimGraph, FaultInAGraphKernelIsSticky) {
  run_isolated({}, [] {
    init_primary();
    CUdeviceptr hole = 0;
    ASSERT_CU(cuMemAddressReserve(&hole, granularity(), 0, 0, 0));
    StoreKernel k;
    CUstream s = new_stream();
    ASSERT_CU(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    ASSERT_CU(k.launch(s, hole + 64, 1));
    CUgraph g = nullptr;
    ASSERT_CU(cuStreamEndCapture(s, &g));
    CUgraphExec e = nullptr;
    ASSERT_CU(cuGraphInstantiateWithFlags(&e, g, 0));
    ASSERT_CU(cuGraphLaunch(e, s));
    EXPECT_EQ(CUDA_ERROR_ILLEGAL_ADDRESS, cuStreamSynchronize(s));
    EXPECT_EQ(CUDA_ERROR_ILLEGAL_ADDRESS, cuGraphLaunch(e, s));
    char what[256] = {};
    EXPECT_EQ(CUDA_ERROR_ILLEGAL_ADDRESS, simcuda_sticky_error(0, what, sizeof what));
    EXPECT_NE(nullptr, std::strstr(what, "store_kernel")) << what;
  });
}
