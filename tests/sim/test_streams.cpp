// Streams, events and host functions: real execution on worker threads, the
// ordering the CUDA driver API promises (cuda.h), and its error contract.
// No wall-clock assertions: concurrency is proven by rendezvous, ordering by
// data and by virtual times; real-time waits are bounded only to avoid hangs.
#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "sim_test_extra.h"

using namespace simtest;

namespace {

using namespace std::chrono_literals;

CUstream new_stream(unsigned flags = CU_STREAM_NON_BLOCKING) {
  CUstream s = nullptr;
  EXPECT_CU(cuStreamCreate(&s, flags));
  return s;
}

CUevent new_event(unsigned flags = 0) {
  CUevent e = nullptr;
  EXPECT_CU(cuEventCreate(&e, flags));
  return e;
}

}  // namespace

// One stream: its work runs in issue order, all of it on one worker thread
// that is not the caller's. Under jitter, so that any reordering shows.
TEST(SimStreams, OneStreamRunsInOrderOnAWorkerThread) {
  run_isolated({{"SIMCUDA_JITTER", "4242"}, {"SIMCUDA_JITTER_MAX_US", "100"}}, [] {
    init_primary();
    CUstream s = new_stream();
    CUfunction call = call_kernel();
    constexpr int kOps = 64;
    std::mutex mu;
    std::vector<std::pair<int, std::thread::id>> ran;
    std::vector<std::function<void()>> fns;
    fns.reserve(kOps);
    for (int i = 0; i < kOps; ++i) {
      fns.emplace_back([&, i] {
        std::lock_guard lk(mu);
        ran.emplace_back(i, std::this_thread::get_id());
      });
    }
    for (int i = 0; i < kOps; ++i) {
      // Alternate host functions and kernels: one queue for both.
      if (i % 2)
        ASSERT_CU(launch_call(call, s, &fns[static_cast<size_t>(i)]));
      else
        ASSERT_CU(host_call(s, &fns[static_cast<size_t>(i)]));
    }
    ASSERT_CU(cuStreamSynchronize(s));
    std::lock_guard lk(mu);
    ASSERT_EQ(static_cast<size_t>(kOps), ran.size());
    for (int i = 0; i < kOps; ++i) EXPECT_EQ(i, ran[static_cast<size_t>(i)].first);
    const std::thread::id worker = ran[0].second;
    EXPECT_NE(std::this_thread::get_id(), worker) << "work must run on the stream's worker";
    for (const auto& [i, id] : ran) EXPECT_EQ(worker, id) << "op " << i;
    ASSERT_CU(cuStreamDestroy_v2(s));
  });
}

// Two streams run at the same time for real: work on each waits (bounded)
// until the other's has started. Serialized execution would time out.
TEST(SimStreams, TwoStreamsRunConcurrently) {
  init_primary();
  CUstream a = new_stream(), b = new_stream(0);
  CUfunction call = call_kernel();

  Rendezvous hr;
  bool ha = false, hb = false;
  std::function<void()> fa = [&] { ha = hr.arrive(); }, fb = [&] { hb = hr.arrive(); };
  ASSERT_CU(host_call(a, &fa));
  ASSERT_CU(host_call(b, &fb));

  Rendezvous kr;
  bool ka = false, kb = false;
  std::function<void()> ga = [&] { ka = kr.arrive(); }, gb = [&] { kb = kr.arrive(); };
  ASSERT_CU(launch_call(call, a, &ga));
  ASSERT_CU(launch_call(call, b, &gb));

  ASSERT_CU(cuStreamSynchronize(a));
  ASSERT_CU(cuStreamSynchronize(b));
  EXPECT_TRUE(ha && hb) << "host functions on two streams did not run concurrently";
  EXPECT_TRUE(ka && kb) << "kernels on two streams did not run concurrently";
  ASSERT_CU(cuStreamDestroy_v2(a));
  ASSERT_CU(cuStreamDestroy_v2(b));
}

// Data a kernel on A writes is seen by a kernel on B queued after
// cuStreamWaitEvent on an event recorded after the write. Jitter delays each
// worker at random, so a missing dependency would show as a stale read.
TEST(SimStreams, StreamWaitEventOrdersAcrossStreamsUnderJitter) {
  run_isolated({{"SIMCUDA_JITTER", "12345"}}, [] {
    init_primary();
    constexpr int kIters = 200;
    CUdeviceptr cells = 0, results = 0;
    ASSERT_CU(cuMemAlloc_v2(&cells, kIters * 8));
    ASSERT_CU(cuMemAlloc_v2(&results, kIters * 8));
    ASSERT_CU(cuMemsetD8_v2(cells, 0, kIters * 8));
    ASSERT_CU(cuMemsetD8_v2(results, 0xFF, kIters * 8));

    static const size_t kStoreSizes[] = {8, 8};  // (uint64_t* dst, uint64_t value)
    simcuda_kernel_desc store{};
    store.name = "store_u64";
    store.fn = [](const void* p, size_t, const simcuda_launch_info*, void*) {
      uint64_t* dst;
      uint64_t v;
      std::memcpy(&dst, p, 8);
      std::memcpy(&v, static_cast<const char*>(p) + 8, 8);
      *dst = v;
    };
    store.param_sizes = kStoreSizes;
    store.num_params = 2;
    store.duration_ns = 1000;
    CUfunction store_fn = nullptr;
    ASSERT_CU(simcuda_register_function(&store, &store_fn));
    CUfunction copy = copy_kernel();

    CUstream a = new_stream(), b = new_stream();
    std::vector<CUevent> evs(kIters);
    for (int i = 0; i < kIters; ++i) {
      evs[static_cast<size_t>(i)] = new_event(CU_EVENT_DISABLE_TIMING);
      CUdeviceptr cell = cells + static_cast<CUdeviceptr>(i) * 8;
      CUdeviceptr res = results + static_cast<CUdeviceptr>(i) * 8;
      uint64_t value = static_cast<uint64_t>(i) + 1;
      void* store_params[] = {&cell, &value};
      ASSERT_CU(launch(store_fn, a, store_params));
      ASSERT_CU(cuEventRecord(evs[static_cast<size_t>(i)], a));
      ASSERT_CU(cuStreamWaitEvent(b, evs[static_cast<size_t>(i)], 0));
      size_t n = 8;
      void* copy_params[] = {&res, &cell, &n};
      ASSERT_CU(launch(copy, b, copy_params));
    }
    ASSERT_CU(cuStreamSynchronize(b));
    ASSERT_CU(cuStreamSynchronize(a));
    std::vector<uint64_t> got(kIters);
    ASSERT_CU(cuMemcpyDtoH_v2(got.data(), results, kIters * 8));
    int stale = 0;
    for (int i = 0; i < kIters; ++i)
      if (got[static_cast<size_t>(i)] != static_cast<uint64_t>(i) + 1) ++stale;
    EXPECT_EQ(0, stale) << "B read before A's write despite cuStreamWaitEvent";

    for (CUevent e : evs) ASSERT_CU(cuEventDestroy_v2(e));
    ASSERT_CU(cuStreamDestroy_v2(a));
    ASSERT_CU(cuStreamDestroy_v2(b));
    ASSERT_CU(cuMemFree_v2(cells));
    ASSERT_CU(cuMemFree_v2(results));
  });
}

// cuda.h (cuEventRecordWithFlags): cuStreamWaitEvent uses the most recently
// captured state at the time of the call, not later records.
TEST(SimStreams, StreamWaitEventBindsToTheRecordCurrentAtTheCall) {
  init_primary();
  CUstream a = new_stream(), b = new_stream();
  CUevent ev = new_event(CU_EVENT_DISABLE_TIMING);
  Gate later;
  std::atomic<bool> b_ran{false};
  std::function<void()> block_a = [&] { later.wait(); };
  std::function<void()> mark_b = [&] { b_ran = true; };

  ASSERT_CU(cuEventRecord(ev, a));         // captures nothing pending
  ASSERT_CU(cuStreamWaitEvent(b, ev, 0));  // binds to that record
  ASSERT_CU(host_call(a, &block_a));       // A now blocks...
  ASSERT_CU(cuEventRecord(ev, a));         // ...and ev is re-recorded after it
  ASSERT_CU(host_call(b, &mark_b));
  EXPECT_TRUE(wait_until([&] { return b_ran.load(); }))
      << "B waited for a record made after its cuStreamWaitEvent";
  later.open = true;
  ASSERT_CU(cuStreamSynchronize(a));
  ASSERT_CU(cuStreamSynchronize(b));
  ASSERT_CU(cuEventDestroy_v2(ev));
  ASSERT_CU(cuStreamDestroy_v2(a));
  ASSERT_CU(cuStreamDestroy_v2(b));
}

// cuda.h: before the first record an event represents an empty set of work.
TEST(SimStreams, NeverRecordedEventIsCompleteAndWaitingOnItIsANoOp) {
  init_primary();
  quiesce();
  CUstream s = new_stream();
  CUevent never = new_event(), start = new_event(), end = new_event();
  EXPECT_CU(cuEventQuery(never));
  EXPECT_CU(cuEventSynchronize(never));

  bool ran = false;
  std::function<void()> mark = [&] { ran = true; };
  ASSERT_CU(cuEventRecord(start, s));
  ASSERT_CU(cuStreamWaitEvent(s, never, 0));
  ASSERT_CU(host_call(s, &mark));
  ASSERT_CU(cuEventRecord(end, s));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_TRUE(ran);
  // No virtual delay either: only the host cost of the calls in between.
  EXPECT_LT(elapsed_ns(start, end), 10'000.0);

  float ms = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, cuEventElapsedTime_v2(&ms, never, end))
      << "cuda.h: an event never recorded gives CUDA_ERROR_INVALID_HANDLE";
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, cuEventElapsedTime_v2(&ms, start, never));
  for (CUevent e : {never, start, end}) ASSERT_CU(cuEventDestroy_v2(e));
  ASSERT_CU(cuStreamDestroy_v2(s));
}

TEST(SimStreams, DestroyedEventIsAnInvalidHandle) {
  init_primary();
  CUstream s = new_stream();
  CUevent ev = new_event(), other = new_event();
  ASSERT_CU(cuEventRecord(ev, s));
  ASSERT_CU(cuEventRecord(other, s));
  ASSERT_CU(cuEventSynchronize(other));
  ASSERT_CU(cuEventDestroy_v2(ev));

  float ms = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, cuEventQuery(ev));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, cuEventRecord(ev, s));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, cuEventRecord(ev, nullptr));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, cuEventSynchronize(ev));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, cuEventElapsedTime_v2(&ms, ev, other));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, cuEventElapsedTime_v2(&ms, other, ev));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, cuStreamWaitEvent(s, ev, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, cuEventDestroy_v2(ev));
  // The other event is untouched.
  EXPECT_CU(cuEventQuery(other));
  ASSERT_CU(cuEventDestroy_v2(other));
  ASSERT_CU(cuStreamDestroy_v2(s));
}

TEST(SimStreams, DestroyedStreamIsAnInvalidHandle) {
  init_primary();
  CUstream s = new_stream(0);
  CUevent ev = new_event();
  ASSERT_CU(cuEventRecord(ev, nullptr));
  ASSERT_CU(cuStreamDestroy_v2(s));

  CUfunction k = nop_kernel(1000);
  std::function<void()> nothing = [] {};
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc_v2(&d, 4096));
  std::vector<unsigned char> host(4096);
  unsigned long long id = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, launch(k, s, nullptr));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, cuStreamSynchronize(s));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, cuStreamQuery(s));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, cuEventRecord(ev, s));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, cuStreamWaitEvent(s, ev, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, host_call(s, &nothing));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, cuMemcpyHtoDAsync_v2(d, host.data(), host.size(), s));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, cuStreamGetId(s, &id));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, cuStreamDestroy_v2(s));

  ASSERT_CU(cuMemFree_v2(d));
  ASSERT_CU(cuEventDestroy_v2(ev));
}

// cuda.h (cuStreamDestroy): with work still pending, the call returns at once
// and the work completes. Here the work waits for a gate only opened after
// cuStreamDestroy returned; a destroy that waited would deadlock (bounded).
TEST(SimStreams, DestroyingAStreamWithPendingWorkReturnsAtOnceAndTheWorkCompletes) {
  init_primary();
  CUstream s = new_stream(0);
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc_v2(&d, 4096));
  ASSERT_CU(cuMemsetD8_v2(d, 0, 4096));
  std::vector<unsigned char> src(4096, 0x3C);
  void* pinned = nullptr;
  ASSERT_CU(cuMemHostAlloc(&pinned, 4096, 0));
  std::memcpy(pinned, src.data(), 4096);

  Gate g;
  bool gate_seen = false;
  std::atomic<bool> done{false};
  std::function<void()> wait_gate = [&] { gate_seen = g.wait(); };
  std::function<void()> finish = [&] { done = true; };
  ASSERT_CU(host_call(s, &wait_gate));
  ASSERT_CU(cuMemcpyHtoDAsync_v2(d, pinned, 4096, s));
  ASSERT_CU(host_call(s, &finish));
  ASSERT_CU(cuStreamDestroy_v2(s));
  EXPECT_FALSE(done.load()) << "the work cannot have finished: its gate is closed";
  g.open = true;
  ASSERT_TRUE(wait_until([&] { return done.load(); })) << "pending work of a destroyed stream";
  EXPECT_TRUE(gate_seen) << "cuStreamDestroy waited for the stream's work";
  std::vector<unsigned char> back(4096);
  ASSERT_CU(cuMemcpyDtoH_v2(back.data(), d, 4096));
  EXPECT_EQ(src, back);
  ASSERT_CU(cuMemFreeHost(pinned));
  ASSERT_CU(cuMemFree_v2(d));
}

// cuda.h (cuCtxSynchronize): blocks until the context has completed all
// preceding requested tasks -- including those of a stream destroyed while
// its work was pending.
TEST(SimStreams, CtxSynchronizeWaitsForWorkOfADestroyedStream) {
  init_primary();
  quiesce();
  CUstream s = new_stream(0);
  CUevent end = new_event();
  std::atomic<bool> done{false};
  std::function<void()> slow = [&] {
    std::this_thread::sleep_for(50ms);
    done = true;
  };
  ASSERT_CU(launch(nop_kernel(10'000'000), s, nullptr));  // 10 ms of virtual time
  ASSERT_CU(host_call(s, &slow));
  ASSERT_CU(cuEventRecord(end, s));
  ASSERT_CU(cuStreamDestroy_v2(s));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_TRUE(done.load()) << "cuCtxSynchronize returned before the destroyed stream's work ran";
  EXPECT_CU(cuEventQuery(end)) << "cuCtxSynchronize returned before the work's virtual end";
  wait_until([&] { return done.load(); });  // keep `slow` alive until it ran
  ASSERT_CU(cuEventDestroy_v2(end));
}

TEST(SimStreams, ElapsedTimeWithDisableTimingIsInvalidHandle) {
  init_primary();
  CUstream s = new_stream();
  CUevent timed = new_event(), untimed = new_event(CU_EVENT_DISABLE_TIMING);
  ASSERT_CU(cuEventRecord(timed, s));
  ASSERT_CU(cuEventRecord(untimed, s));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_CU(cuEventQuery(untimed));
  float ms = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, cuEventElapsedTime_v2(&ms, timed, untimed));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, cuEventElapsedTime_v2(&ms, untimed, timed));
  EXPECT_CU(cuEventElapsedTime_v2(&ms, timed, timed));
  EXPECT_EQ(0.0f, ms);
  ASSERT_CU(cuEventDestroy_v2(timed));
  ASSERT_CU(cuEventDestroy_v2(untimed));
  ASSERT_CU(cuStreamDestroy_v2(s));
}

TEST(SimStreams, ElapsedTimeOnUnfinishedWorkIsNotReady) {
  init_primary();
  CUstream s = new_stream();
  CUevent start = new_event(), end = new_event();
  ASSERT_CU(cuEventRecord(start, s));
  ASSERT_CU(launch(nop_kernel(10'000'000), s, nullptr));  // ends 10 ms of virtual time later
  ASSERT_CU(cuEventRecord(end, s));
  float ms = -1;
  EXPECT_EQ(CUDA_ERROR_NOT_READY, cuEventElapsedTime_v2(&ms, start, end));
  EXPECT_EQ(CUDA_ERROR_NOT_READY, cuEventQuery(end));
  ASSERT_CU(cuEventSynchronize(end));
  ASSERT_CU(cuEventElapsedTime_v2(&ms, start, end));
  EXPECT_GE(ms, 10.0f);
  ASSERT_CU(cuEventDestroy_v2(start));
  ASSERT_CU(cuEventDestroy_v2(end));
  ASSERT_CU(cuStreamDestroy_v2(s));
}

// A query reports done only once the work ran for real, even when its virtual
// end (a host function takes no virtual time) has long passed.
TEST(SimStreams, QueriesAreNotReadyUntilTheWorkRanForReal) {
  init_primary();
  CUstream s = new_stream();
  CUevent ev = new_event();
  Gate g;
  std::function<void()> hold = [&] { g.wait(); };
  ASSERT_CU(host_call(s, &hold));
  ASSERT_CU(cuEventRecord(ev, s));
  simcuda_host_advance_ns(1'000'000'000);  // a virtual second later
  EXPECT_EQ(CUDA_ERROR_NOT_READY, cuStreamQuery(s));
  EXPECT_EQ(CUDA_ERROR_NOT_READY, cuEventQuery(ev));
  g.open = true;
  EXPECT_TRUE(wait_until([&] { return cuStreamQuery(s) == CUDA_SUCCESS; }));
  EXPECT_CU(cuEventQuery(ev));
  ASSERT_CU(cuEventDestroy_v2(ev));
  ASSERT_CU(cuStreamDestroy_v2(s));
}

// cuda.h (cuLaunchHostFunc): the host function must not make CUDA calls; the
// sim refuses them with CUDA_ERROR_NOT_PERMITTED (and does nothing).
TEST(SimStreams, CudaCallFromAHostFunctionIsNotPermitted) {
  init_primary();
  CUstream s = new_stream();
  std::atomic<int> inner_runs{0};
  std::function<void()> inner = [&] { inner_runs++; };
  CUresult query = CUDA_SUCCESS, ctx = CUDA_SUCCESS, alloc = CUDA_SUCCESS, nested = CUDA_SUCCESS;
  CUdeviceptr d = 0;
  std::function<void()> outer = [&] {
    CUcontext c = nullptr;
    query = cuStreamQuery(s);
    ctx = cuCtxGetCurrent(&c);
    alloc = cuMemAlloc_v2(&d, 4096);
    nested = host_call(s, &inner);
  };
  ASSERT_CU(host_call(s, &outer));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(CUDA_ERROR_NOT_PERMITTED, query);
  EXPECT_EQ(CUDA_ERROR_NOT_PERMITTED, ctx);
  EXPECT_EQ(CUDA_ERROR_NOT_PERMITTED, alloc);
  EXPECT_EQ(CUDA_ERROR_NOT_PERMITTED, nested);
  EXPECT_EQ(0u, d);
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(0, inner_runs.load()) << "a refused call must not enqueue anything";
  // The stream and the caller are unaffected.
  ASSERT_CU(host_call(s, &inner));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(1, inner_runs.load());
  ASSERT_CU(cuStreamDestroy_v2(s));
}

// CUDA programming guide, "Default stream" / cuda.h "Stream synchronization
// behavior": the legacy NULL stream waits for prior work of blocking streams
// (created with flags 0) and they wait for its prior work; streams created
// with CU_STREAM_NON_BLOCKING do neither. Checked on virtual times: an event
// recorded on one stream right after a 1 ms kernel on the other.
TEST(SimStreams, LegacyDefaultStreamSynchronizesWithBlockingStreamsOnly) {
  init_primary();
  constexpr uint64_t kKernel = 1'000'000;
  CUfunction k = nop_kernel(kKernel);
  CUevent before = new_event(), after = new_event();
  auto delay_ns = [&](CUstream first, CUstream second) {
    quiesce();
    EXPECT_CU(cuEventRecord(before, second));
    EXPECT_CU(launch(k, first, nullptr));
    EXPECT_CU(cuEventRecord(after, second));
    EXPECT_CU(cuCtxSynchronize());
    return elapsed_ns(before, after);
  };
  CUstream blocking = new_stream(0), nonblocking = new_stream(CU_STREAM_NON_BLOCKING);

  EXPECT_GE(delay_ns(blocking, nullptr), static_cast<double>(kKernel))
      << "NULL stream work must wait for a blocking stream's prior work";
  EXPECT_GE(delay_ns(nullptr, blocking), static_cast<double>(kKernel))
      << "blocking stream work must wait for the NULL stream's prior work";
  EXPECT_LT(delay_ns(nonblocking, nullptr), kKernel / 2.0)
      << "NULL stream work must not wait for a non-blocking stream";
  EXPECT_LT(delay_ns(nullptr, nonblocking), kKernel / 2.0)
      << "non-blocking stream work must not wait for the NULL stream";

  // For real, too: a host function on the NULL stream sees what one queued
  // before it on a blocking stream did, however long that took.
  std::atomic<bool> written{false};
  bool seen = false;
  std::function<void()> slow_write = [&] {
    std::this_thread::sleep_for(20ms);
    written = true;
  };
  std::function<void()> read = [&] { seen = written.load(); };
  ASSERT_CU(host_call(blocking, &slow_write));
  ASSERT_CU(host_call(nullptr, &read));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_TRUE(seen);

  ASSERT_CU(cuEventDestroy_v2(before));
  ASSERT_CU(cuEventDestroy_v2(after));
  ASSERT_CU(cuStreamDestroy_v2(blocking));
  ASSERT_CU(cuStreamDestroy_v2(nonblocking));
}

TEST(SimStreams, PerThreadDefaultStreamIsDistinctPerThread) {
  CUcontext ctx = init_primary();
  unsigned long long main_id = 0, main_again = 0, legacy_id = 0, other_id = 0;
  ASSERT_CU(cuStreamGetId(CU_STREAM_PER_THREAD, &main_id));
  ASSERT_CU(cuStreamGetId(CU_STREAM_PER_THREAD, &main_again));
  ASSERT_CU(cuStreamGetId(nullptr, &legacy_id));
  EXPECT_EQ(main_id, main_again);
  EXPECT_NE(main_id, legacy_id);

  CUresult r1 = CUDA_ERROR_UNKNOWN, r2 = CUDA_ERROR_UNKNOWN;
  std::thread t([&] {
    r1 = cuCtxSetCurrent(ctx);
    r2 = cuStreamGetId(CU_STREAM_PER_THREAD, &other_id);
  });
  t.join();
  ASSERT_CU(r1);
  ASSERT_CU(r2);
  EXPECT_NE(main_id, other_id);
  EXPECT_NE(legacy_id, other_id);

  // And it is a stream of its own: work on it is not on the legacy stream.
  quiesce();
  ASSERT_CU(launch(nop_kernel(10'000'000), CU_STREAM_PER_THREAD, nullptr));
  EXPECT_EQ(CUDA_ERROR_NOT_READY, cuStreamQuery(CU_STREAM_PER_THREAD));
  EXPECT_CU(cuStreamQuery(CU_STREAM_LEGACY));
  ASSERT_CU(cuStreamSynchronize(CU_STREAM_PER_THREAD));
  EXPECT_CU(cuStreamQuery(CU_STREAM_PER_THREAD));
}

TEST(SimStreams, CtxSynchronizeWaitsForAllStreams) {
  init_primary();
  quiesce();
  CUstream s1 = new_stream(), s2 = new_stream(0);
  constexpr size_t kBytes = 1 << 20;
  void* pinned = nullptr;
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemHostAlloc(&pinned, kBytes, 0));
  ASSERT_CU(cuMemAlloc_v2(&d, kBytes));
  std::atomic<int> done{0};
  std::function<void()> slow = [&] {
    std::this_thread::sleep_for(20ms);
    done++;
  };
  CUfunction call = call_kernel(3'000'000);
  ASSERT_CU(cuMemcpyHtoDAsync_v2(d, pinned, kBytes, s1));
  ASSERT_CU(host_call(s1, &slow));
  ASSERT_CU(launch_call(call, s2, &slow));
  ASSERT_CU(host_call(nullptr, &slow));
  ASSERT_CU(host_call(CU_STREAM_PER_THREAD, &slow));
  const uint64_t idle = simcuda_device_idle_at_ns(0);
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(4, done.load());
  EXPECT_GE(simcuda_now_ns(), idle) << "the host clock must reach the end of all work";
  for (CUstream s : {s1, s2, static_cast<CUstream>(nullptr), CU_STREAM_PER_THREAD})
    EXPECT_CU(cuStreamQuery(s));
  ASSERT_CU(cuStreamDestroy_v2(s1));
  ASSERT_CU(cuStreamDestroy_v2(s2));
  ASSERT_CU(cuMemFreeHost(pinned));
  ASSERT_CU(cuMemFree_v2(d));
}

TEST(SimStreams, NoCurrentContextIsInvalidContext) {
  init_primary();
  CUstream made = nullptr;
  CUresult create = CUDA_SUCCESS, alloc = CUDA_SUCCESS, sync = CUDA_SUCCESS, event = CUDA_SUCCESS,
           get = CUDA_ERROR_UNKNOWN;
  CUcontext current = reinterpret_cast<CUcontext>(1);
  std::thread t([&] {  // a new thread has no current context
    CUdeviceptr d = 0;
    CUevent e = nullptr;
    get = cuCtxGetCurrent(&current);
    create = cuStreamCreate(&made, 0);
    alloc = cuMemAlloc_v2(&d, 4096);
    sync = cuCtxSynchronize();
    event = cuEventCreate(&e, 0);
  });
  t.join();
  EXPECT_CU(get);
  EXPECT_EQ(nullptr, current);
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, create);
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, alloc);
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, sync);
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, event);

  // Same after clearing the current context on this thread.
  CUcontext ctx = nullptr;
  ASSERT_CU(cuCtxGetCurrent(&ctx));
  ASSERT_CU(cuCtxSetCurrent(nullptr));
  CUstream s = nullptr;
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, cuStreamCreate(&s, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, launch(nop_kernel(1), nullptr, nullptr));
  ASSERT_CU(cuCtxSetCurrent(ctx));
  ASSERT_CU(cuStreamCreate(&s, 0));
  ASSERT_CU(cuStreamDestroy_v2(s));
}

TEST(SimStreams, CallsBeforeCuInitAreNotInitialized) {
  run_isolated({}, [] {
    int n = 0;
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    CUstream s = nullptr;
    CUevent e = nullptr;
    CUdeviceptr d = 0;
    EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED, cuDeviceGetCount(&n));
    EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED, cuDeviceGet(&dev, 0));
    EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED, cuDevicePrimaryCtxRetain(&ctx, 0));
    EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED, cuCtxGetCurrent(&ctx));
    EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED, cuStreamCreate(&s, 0));
    EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED, cuEventCreate(&e, 0));
    EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED, cuMemAlloc_v2(&d, 4096));
    EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED, cuCtxSynchronize());
    EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED, cuStreamSynchronize(nullptr));
    ASSERT_CU(cuInit(0));
    EXPECT_CU(cuDeviceGetCount(&n));
    EXPECT_EQ(1, n);
  });
}
