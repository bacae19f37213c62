// The access tracker's launch path, timed: what spillway adds to every kernel
// launch when tracking is on (issue 4). One iteration is Tracker::scan_launch
// on a launch's packed arguments: the parameter layout from the per-function
// cache, a range check of every 8-byte-aligned word against the allocator's
// arena, and for each word that is a pointer into a spillway block the
// allocator's before_use (its lock, the granule-table or address lookup, the
// user and last-use bookkeeping). No CUPTI or driver call is made in the
// timed loop (checked): the figures are the host code's wall-clock cost on
// this machine, not simulated time.
//
// Live blocks: 100 or 10,000, as a PyTorch job has them: mostly small
// (512 B to 64 KiB, carved from chunks) and one in 20 large (2 to 8 MiB,
// granule-aligned ranges). The argument buffer is one by-value struct of 64 B,
// 512 B or 4 KiB (what a CUTLASS-style kernel passes), holding 8 pointers into
// live blocks (interior pointers included), spread over it; the other words
// are sizes, strides and flags, as real arguments are.
#include <benchmark/benchmark.h>
#include <cuda.h>
#include <simcuda.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "allocator.h"
#include "cupti_api.h"
#include "driver.h"
#include "tracker.h"

namespace {

constexpr size_t KiB = 1ull << 10;
constexpr size_t MiB = 1ull << 20;

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

void noop(const void*, size_t, const simcuda_launch_info*, void*) {}

// The process-wide set-up: a driver, CUPTI, an allocator with its blocks, a
// tracker subscribed to the simulated CUPTI.
struct World {
  const spillway::cu::Driver* d = nullptr;
  const spillway::cupti::Api* api = nullptr;
  std::unique_ptr<spillway::Allocator> alloc;
  std::unique_ptr<spillway::Tracker> tracker;
  std::vector<std::pair<char*, size_t>> blocks;
  std::string error;

  bool start(size_t live) {
    std::string why;
    if (cuInit(0) != CUDA_SUCCESS) return fail("cuInit");
    CUdevice dev;
    CUcontext ctx;
    if (cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
      return fail("context");
    d = spillway::cu::load(&why);
    if (!d) return fail(why);
    api = spillway::cupti::load(SIM_CUPTI_PATH, &why);
    if (!api) return fail(why);
    spillway::AllocatorOptions o;  // no budget: nothing moves
    alloc = spillway::Allocator::create(*d, o, &why);
    if (!alloc) return fail(why);
    tracker = spillway::Tracker::start(*api, *d, *alloc, &why);
    if (!tracker) return fail(why);
    uint64_t x = 12345;
    for (size_t i = 0; i < live; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const size_t size = i % 20 == 19 ? (2 + (x >> 33) % 7) * MiB : 512 + ((x >> 33) % (64 * KiB));
      void* p = alloc->malloc(size, nullptr);
      if (!p) return fail("malloc");
      blocks.emplace_back(static_cast<char*>(p), size);
    }
    return true;
  }
  bool fail(const std::string& why) {
    error = why;
    return false;
  }
};

// The world of the benchmark running now, rebuilt when the number of live
// blocks changes (one CUPTI subscriber at a time: the old tracker goes first).
// The last one is never destroyed, as the shim's runtime never is: at static
// destruction the simulated driver's own state may already be gone (the
// allocator's destructor then corrupted the heap: "malloc(): unsorted double
// linked list corrupted" after the last benchmark).
World* world(size_t live) {
  static World* w = nullptr;
  static size_t w_live = 0;
  if (!w || w_live != live) {
    if (w) {
      w->tracker.reset();
      for (auto& [p, size] : w->blocks) w->alloc->free(p, size, nullptr);
      w->alloc.reset();
      delete w;
    }
    w = new World;
    w_live = live;
    if (!w->start(live)) std::fprintf(stderr, "set-up failed: %s\n", w->error.c_str());
  }
  return w;
}

void BM_LaunchScan(benchmark::State& state) {
  const size_t live = static_cast<size_t>(state.range(0));
  const size_t bytes = static_cast<size_t>(state.range(1));
  World* w = world(live);
  if (!w->tracker) {
    state.SkipWithError(("set-up failed: " + w->error).c_str());
    return;
  }
  // A function whose one parameter is the `bytes`-byte struct.
  const size_t sizes[] = {bytes};
  simcuda_kernel_desc desc{};
  desc.name = "bench_kernel";
  desc.fn = noop;
  desc.param_sizes = sizes;
  desc.num_params = 1;
  desc.duration_ns = 1000;
  CUfunction f = nullptr;
  if (simcuda_register_function(&desc, &f) != CUDA_SUCCESS) {
    state.SkipWithError("register");
    return;
  }
  // The argument struct: 8 pointers into the first `live` blocks, spread
  // over the words; scalars elsewhere.
  std::vector<uint64_t> arg(bytes / 8);
  const size_t words = arg.size();
  for (size_t i = 0; i < words; ++i) arg[i] = i * 3 + 1;
  for (size_t k = 0; k < 8 && k < words; ++k) {
    const auto& [p, size] = w->blocks[(k * 7919) % live];
    arg[k * words / 8] = reinterpret_cast<uint64_t>(p + (k % 2 ? size / 2 : 0));
  }
  void* params[] = {arg.data()};
  w->tracker->scan_launch(f, params, nullptr, nullptr);  // caches the layout
  const uint64_t calls = driver_calls();
  const uint64_t touches = w->tracker->touches_reported();
  for (auto _ : state) w->tracker->scan_launch(f, params, nullptr, nullptr);
  if (driver_calls() != calls) state.SkipWithError("the timed loop called the driver");
  state.counters["pointers_per_launch"] =
      benchmark::Counter(static_cast<double>(w->tracker->touches_reported() - touches) /
                         static_cast<double>(state.iterations()));
}

BENCHMARK(BM_LaunchScan)
    ->ArgNames({"live_blocks", "param_bytes"})
    ->ArgsProduct({{100, 10000}, {64, 512, 4096}})
    ->MinTime(0.2)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);

}  // namespace

BENCHMARK_MAIN();
