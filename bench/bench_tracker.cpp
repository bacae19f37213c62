// The access tracker's launch path, timed through the shim's Runtime: what
// spillway adds to every kernel launch of a preloaded job (issue 4's aim,
// issue 12 item 4's target: <= 300 ns at 10,000 live blocks and 512 B of
// arguments). The figures are the host code's CPU time on this machine, not
// simulated time.
//
// The path is the one a preloaded job takes. The Runtime is the process's
// own (Runtime::get, configured from the environment as in a job), so its
// tracker is subscribed to the simulated CUPTI and reports to the Runtime,
// which hands the launch's ranges to its one allocator. One iteration is one
// launch, both sides:
//   ENTER: Tracker's CUPTI callback -> scan_launch (the per-function layout
//     from the cache, an inline check of every 8-byte-aligned argument word
//     against the address envelope, may_own for the words inside it) ->
//     deliver -> Runtime::before_use (for_each_owner) -> Allocator::before_use
//     (its lock, the block lookups, the launch's blocks held, the users, the
//     learned schedule told of each large block)
//   EXIT: the same callback -> release_held -> Runtime::after_use ->
//     Allocator::after_use (the lock again, the holds released; once the
//     budget was crossed, one event recorded after the launch, a mark, that
//     its large blocks keep: shim/src/copy_streams.h).
//
// How: each iteration calls the tracker's CUPTI entry point twice, with the
// callback data the simulated CUPTI builds for cuLaunchKernel (sim/cupti/
// callbacks.cpp: deliver), at CUPTI_API_ENTER and CUPTI_API_EXIT. The entry
// point is had from libbench_cupti_capture.so (cupti_capture.cpp), a CUPTI in
// front of the simulated one that SPILLWAY_CUPTI_PATH names: it passes the
// Runtime's cuptiSubscribe through and keeps the callback. No seam in the
// Runtime or the tracker. This is everything spillway runs for a launch, and
// nothing of the driver's or CUPTI's own work, with warm caches.
//
// Why not real cuLaunchKernel calls, timed with the tracker at work and with
// it told to ignore them, and subtracted: one simulated launch costs the host
// 2-5 us (a shared buffer, a std::function, a lookup per argument word, a
// queue shared with the stream's worker thread, whose lock puts the launching
// thread to sleep now and then on 2 vCPUs), with a spread of 200-400 ns
// between repetitions, so the difference is noisier than the figure sought.
// BM_SimLaunch keeps that way as a cross-check (10,000 blocks, 512 B): run
// tracked:0 and tracked:1 in separate processes, alternating, several times
// (in one process their order changes them). Their difference also holds
// what the simulator's launch between the two callbacks does to the caches
// spillway's code then finds cold, and the reverse: the cost a job pays in
// place, an upper side to the figure here.
//
// Set-up: SPILLWAY_GPU_BUDGET=4GiB, the default policy (the learned
// schedule), the background mover on (as with tracking in a job). Live
// blocks: 100 or 10,000, as a PyTorch job has them: mostly small (512 B to
// 64 KiB, carved from chunks) and one in 20 large (2 to 8 MiB,
// granule-aligned ranges), about 2.8 GiB at 10,000. The argument buffer is one
// by-value struct of 64 B, 512 B or 4 KiB (what a CUTLASS-style kernel
// passes), holding 8 pointers into live blocks (interior pointers included;
// one of them into a large block), spread over it; the other words are sizes,
// strides and flags, as real arguments are. A step ends every
// kLaunchesPerStep launches, with the timer paused (a step's end is not a
// launch's cost): the host waits for the streams, as a job reading its loss
// does, and marks the step, as the bootstrap does (the schedule's record
// turns).
//
// BM_Launch: within the budget (no mark). BM_LaunchOverBudget: the budget was
// crossed once (ballast allocated until an allocation had to evict a live
// block, then freed), so every launch records its mark at exit; the launch's
// blocks are resident and the mover idle, as in a job's steady state over
// its budget. The budget is never un-crossed: the over-budget cases run after
// the others, in registration order (a within-budget case run after them, as
// random interleaving would, fails). Each checks which driver calls its
// timed loop made: none within the budget, exactly one cuEventRecord per
// launch over it (and the step ends' cuCtxSynchronize).
// BM_SimEventRecord times that cuEventRecord alone on the simulated driver:
// the driver's share of the over-budget figure, not spillway's.
#include <benchmark/benchmark.h>
#include <cuda.h>
#include <cupti.h>
#include <dlfcn.h>
#include <simcuda.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "access.h"
#include "allocator.h"
#include "runtime.h"

namespace {

constexpr size_t KiB = 1ull << 10;
constexpr size_t MiB = 1ull << 20;
constexpr uint64_t kLaunchesPerStep = 5000;

constexpr const char* kEntryPoints[] = {
#define DRIVER_ENTRY_POINT(name) #name,
#include "driver_entry_points.def"
#undef DRIVER_ENTRY_POINT
};

uint64_t driver_calls() {
  uint64_t n = 0;
  for (const char* e : kEntryPoints) n += simcuda_call_count(e);
  return n;
}

// The driver calls made since it was taken, by entry point ("cuEventRecord
// 10, cuMemUnmap 4"): what a failed check names.
class CallsSince {
 public:
  CallsSince() {
    for (const char* e : kEntryPoints) at_.push_back(simcuda_call_count(e));
  }
  uint64_t of(const char* name) const {
    for (size_t i = 0; i < at_.size(); ++i)
      if (std::strcmp(kEntryPoints[i], name) == 0) return simcuda_call_count(name) - at_[i];
    return 0;
  }
  uint64_t total() const {
    uint64_t n = 0;
    for (size_t i = 0; i < at_.size(); ++i) n += simcuda_call_count(kEntryPoints[i]) - at_[i];
    return n;
  }
  std::string describe() const {
    std::string out;
    for (size_t i = 0; i < at_.size(); ++i)
      if (const uint64_t n = simcuda_call_count(kEntryPoints[i]) - at_[i])
        out += (out.empty() ? "" : ", ") + std::string(kEntryPoints[i]) + " " + std::to_string(n);
    return out.empty() ? "none" : out;
  }

 private:
  std::vector<uint64_t> at_;
};

// Google Benchmark 1.7.1 crashes computing the aggregates when the first
// repetition is the one that failed: the reason goes to stderr as well.
void skip(benchmark::State& state, const std::string& why) {
  std::fprintf(stderr, "bench_tracker: %s\n", why.c_str());
  state.SkipWithError(why.c_str());
}

void noop(const void*, size_t, const simcuda_launch_info*, void*) {}

// What libbench_cupti_capture.so keeps (cupti_capture.cpp).
struct BenchCuptiSubscriber {
  CUpti_CallbackFunc callback;
  void* userdata;
};

// The process: the simulated driver, the Runtime with its tracker, the
// tracker's CUPTI entry point; and the live blocks of the case running now.
struct World {
  spillway::Runtime* rt = nullptr;
  spillway::Allocator* alloc = nullptr;
  BenchCuptiSubscriber sub{};
  CUcontext ctx = nullptr;
  std::vector<std::pair<char*, size_t>> blocks;
  size_t live = 0;
  bool over_budget = false;
  std::string error;

  bool start() {
    // A job's configuration; the budget leaves room for 10,000 blocks.
    setenv("SPILLWAY_CUPTI_PATH", BENCH_CUPTI_CAPTURE, 1);
    setenv("SPILLWAY_GPU_BUDGET", "4GiB", 1);
    setenv("SPILLWAY_LOG_LEVEL", "warn", 0);
    CUdevice dev;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
      return fail("context");
    rt = &spillway::Runtime::get();
    alloc = rt->allocator(0);
    if (!alloc) return fail("no allocator");
    void* lib = dlopen(BENCH_CUPTI_CAPTURE, RTLD_NOW | RTLD_NOLOAD);
    const auto* s =
        lib ? static_cast<const BenchCuptiSubscriber*>(dlsym(lib, "bench_cupti_subscriber"))
            : nullptr;
    if (!s || !s->callback) return fail("the Runtime's tracker did not subscribe to CUPTI");
    sub = *s;
    return true;
  }

  // `n` live blocks, the first `n` of one fixed sequence.
  void populate(size_t n) {
    for (auto& [p, size] : blocks) alloc->free(p, size, nullptr);
    blocks.clear();
    uint64_t x = 12345;
    for (size_t i = 0; i < n; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const size_t size = i % 20 == 19 ? (2 + (x >> 33) % 7) * MiB : 512 + ((x >> 33) % (64 * KiB));
      void* p = alloc->malloc(size, nullptr);
      if (!p) {
        fail("malloc");
        return;
      }
      blocks.emplace_back(static_cast<char*>(p), size);
    }
    live = n;
  }

  // Large ballast until an allocation has had to evict a live block (the
  // budget is crossed for good: Budget::over_seen), then freed.
  bool cross_budget() {
    constexpr size_t kBallast = 256 * MiB;
    const uint64_t evicted = rt->stats().blocks_evicted;
    std::vector<void*> ballast;
    bool crossed = false;
    for (size_t i = 0; i < 64 && !crossed; ++i) {
      void* p = alloc->malloc(kBallast, nullptr);
      if (!p) break;
      ballast.push_back(p);
      crossed = rt->stats().blocks_evicted > evicted;
    }
    for (void* p : ballast) alloc->free(p, kBallast, nullptr);
    return crossed || fail("the ballast evicted nothing");
  }

  // Until the background mover (a round every 5 ms) has had nothing to do
  // for a while: no driver call in 30 ms, three times in a row. The streams
  // are drained first each time: a block freed during its eviction copy is
  // reusable, and a cached one released, only once that copy is done.
  void settle() {
    for (int quiet = 0, rounds = 0; quiet < 3 && rounds < 200; ++rounds) {
      cuCtxSynchronize();
      const uint64_t calls = driver_calls();
      usleep(30000);
      quiet = driver_calls() == calls ? quiet + 1 : 0;
    }
  }

  bool fail(const std::string& why) {
    if (error.empty()) error = why;
    return false;
  }
};

// The one world, started on first use. Never destroyed, as the Runtime it
// uses never is.
World* world() {
  static World* w = [] {
    auto* n = new World;
    n->start();
    return n;
  }();
  return w;
}

// The world set up for a case: `live` blocks, over the budget or not (a
// budget crossed stays crossed: such a case must come after every case
// within it).
World* world(size_t live, bool over_budget) {
  World* w = world();
  if (!w->error.empty()) return w;
  if (w->over_budget && !over_budget) {
    w->fail("the budget was crossed by an earlier case (random interleaving?)");
    return w;
  }
  if (over_budget && !w->over_budget) {
    w->over_budget = w->cross_budget();
    w->settle();
  }
  if (w->live != live) {
    w->populate(live);
    w->settle();
  }
  return w;
}

// A function whose one parameter is a `bytes`-byte struct (the simulator
// copies the descriptor).
CUfunction function(size_t bytes) {
  static std::map<size_t, CUfunction> made;
  CUfunction& f = made[bytes];
  if (f) return f;
  const size_t sizes[] = {bytes};
  simcuda_kernel_desc desc{};
  desc.name = "bench_kernel";
  desc.fn = noop;
  desc.param_sizes = sizes;
  desc.num_params = 1;
  desc.duration_ns = 1000;
  if (simcuda_register_function(&desc, &f) != CUDA_SUCCESS) f = nullptr;
  return f;
}

// One launch's arguments: 8 pointers into the live blocks, spread over the
// words (interior pointers every other one); scalars elsewhere.
std::vector<uint64_t> arguments(const World& w, size_t bytes) {
  std::vector<uint64_t> arg(bytes / 8);
  const size_t words = arg.size();
  for (size_t i = 0; i < words; ++i) arg[i] = i * 3 + 1;
  for (size_t k = 0; k < 8 && k < words; ++k) {
    const auto& [p, size] = w.blocks[(k * 7919) % w.live];
    arg[k * words / 8] = reinterpret_cast<uint64_t>(p + (k % 2 ? size / 2 : 0));
  }
  return arg;
}

// A step's end, every kLaunchesPerStep launches, with the timer paused: the
// host waits for the step's work (as a job does when it reads its loss), so
// that the simulated streams' queues stay short, and the step is marked.
void step_end(benchmark::State& state, World* w) {
  state.PauseTiming();
  cuCtxSynchronize();
  w->rt->mark_step();
  state.ResumeTiming();
}

// cuLaunchKernel as CUPTI reports it to its subscriber: the callback at the
// call's enter, then at its exit, with one correlation id.
struct Launcher {
  BenchCuptiSubscriber sub;
  CUcontext ctx;
  cuLaunchKernel_params params;
  uint32_t correlation = 1u << 31;  // apart from the simulator's own ids

  void launch() {
    CUresult result = CUDA_SUCCESS;
    uint64_t correlation_data = 0;
    CUpti_CallbackData d{};
    d.callbackSite = CUPTI_API_ENTER;
    d.functionName = "cuLaunchKernel";
    d.functionParams = &params;
    d.functionReturnValue = &result;
    d.context = ctx;
    d.correlationData = &correlation_data;
    d.correlationId = ++correlation;
    sub.callback(sub.userdata, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
                 &d);
    d.callbackSite = CUPTI_API_EXIT;
    sub.callback(sub.userdata, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
                 &d);
  }
};

void run_launches(benchmark::State& state, bool over_budget) {
  const size_t live = static_cast<size_t>(state.range(0));
  const size_t bytes = static_cast<size_t>(state.range(1));
  World* w = world(live, over_budget);
  if (!w->error.empty()) {
    skip(state, "set-up failed: " + w->error);
    return;
  }
  const CUfunction f = function(bytes);
  if (!f) {
    skip(state, "register");
    return;
  }
  std::vector<uint64_t> arg = arguments(*w, bytes);
  void* kernel_params[] = {arg.data()};
  Launcher l{w->sub, w->ctx, {f, 1, 1, 1, 1, 1, 1, 0, nullptr, kernel_params, nullptr}};
  // The layout cached, an evicted block of the launch restored, the marks'
  // events made.
  for (int i = 0; i < 3; ++i) l.launch();
  const CallsSince calls;
  const spillway::Stats before = w->rt->stats();
  uint64_t n = 0;
  for (auto _ : state) {
    l.launch();
    if (++n % kLaunchesPerStep == 0) step_end(state, w);
  }
  const spillway::Stats after = w->rt->stats();
  const uint64_t marks = calls.of("cuEventRecord");
  const uint64_t syncs = calls.of("cuCtxSynchronize");
  if (marks != (over_budget ? n : 0) || syncs != n / kLaunchesPerStep ||
      calls.total() != marks + syncs) {
    skip(state, "driver calls in the timed loop of " + std::to_string(n) +
                    " launches: " + calls.describe());
  } else if (after.blocks_restored != before.blocks_restored ||
             after.blocks_evicted != before.blocks_evicted) {
    skip(state, "a block moved in the timed loop");
  } else {
    state.counters["marks_per_launch"] =
        benchmark::Counter(static_cast<double>(marks) / static_cast<double>(n));
  }
}

void BM_Launch(benchmark::State& state) {
  run_launches(state, false);
}

void BM_LaunchOverBudget(benchmark::State& state) {
  run_launches(state, true);
}

// The cross-check: real cuLaunchKernel calls through the simulated driver
// and CUPTI, with the tracker at work (tracked:1) and with it told to ignore
// them as it ignores spillway's own calls (tracked:0, InternalCalls: the
// callback returns at its first check). The difference is spillway's share
// in place, within the noise of two simulated launches (see the top).
void BM_SimLaunch(benchmark::State& state) {
  const bool tracked = state.range(0) != 0;
  World* w = world(10000, false);
  if (!w->error.empty()) {
    skip(state, "set-up failed: " + w->error);
    return;
  }
  const CUfunction f = function(512);
  std::vector<uint64_t> arg = arguments(*w, 512);
  void* kernel_params[] = {arg.data()};
  auto launch = [&] {
    return cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, kernel_params, nullptr);
  };
  uint64_t n = 0;
  bool ok = true;
  for (auto _ : state) {
    if (tracked) {
      ok = launch() == CUDA_SUCCESS && ok;
    } else {
      spillway::InternalCalls ignored;
      ok = launch() == CUDA_SUCCESS && ok;
    }
    if (++n % kLaunchesPerStep == 0) step_end(state, w);
  }
  cuCtxSynchronize();
  if (!ok) skip(state, "cuLaunchKernel failed");
}

// The simulated driver's cuEventRecord on the launches' stream: what each
// over-budget launch pays the driver for its mark.
void BM_SimEventRecord(benchmark::State& state) {
  World* w = world();
  if (!w->error.empty()) {
    skip(state, "set-up failed: " + w->error);
    return;
  }
  CUevent ev = nullptr;
  if (cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
    skip(state, "cuEventCreate");
    return;
  }
  uint64_t n = 0;
  for (auto _ : state) {
    cuEventRecord(ev, nullptr);
    if (++n % kLaunchesPerStep == 0) step_end(state, w);
  }
  cuCtxSynchronize();
  cuEventDestroy(ev);
}

BENCHMARK(BM_Launch)
    ->ArgNames({"live_blocks", "param_bytes"})
    ->ArgsProduct({{100, 10000}, {64, 512, 4096}})
    ->MinTime(0.5)
    ->Repetitions(5)
    ->DisplayAggregatesOnly(true);
BENCHMARK(BM_SimLaunch)
    ->ArgName("tracked")
    ->Arg(0)
    ->Arg(1)
    ->MinTime(0.5)
    ->Repetitions(5)
    ->DisplayAggregatesOnly(true);
BENCHMARK(BM_SimEventRecord)->MinTime(0.5)->Repetitions(5)->DisplayAggregatesOnly(true);
BENCHMARK(BM_LaunchOverBudget)
    ->ArgNames({"live_blocks", "param_bytes"})
    ->ArgsProduct({{100, 10000}, {64, 512, 4096}})
    ->MinTime(0.5)
    ->Repetitions(5)
    ->DisplayAggregatesOnly(true);

}  // namespace

BENCHMARK_MAIN();
