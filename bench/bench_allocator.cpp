// The allocator's host fast path, timed: malloc+free pairs in steady state on
// the simulated GPU, in-process (spillway::Allocator) and through the C ABI of
// libspillway.so (spillway_malloc/spillway_free, which add the Runtime lookup).
// Results and the command are in docs/performance.md.
//
// What is timed is the allocator's own host code, in wall-clock time on this
// machine. The GPU is simulated and the steady state makes no driver call at
// all (each benchmark checks that, and fails if one is made), so no simulated
// device work and no simulated driver cost is in these figures.
//
// Every benchmark first warms the allocator's caches with untimed rounds of
// the pattern it times, then checks that the timed loop made no driver call:
// the timed pairs are all cache hits, with no budget pressure.
#include <benchmark/benchmark.h>
#include <cuda.h>
#include <dlfcn.h>
#include <simcuda.h>
#include <spillway.h>
#include <time.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "allocator.h"
#include "config.h"
#include "driver.h"

namespace {

constexpr size_t KiB = 1ull << 10;
constexpr size_t MiB = 1ull << 20;
constexpr size_t GiB = 1ull << 30;

// The stream PyTorch uses unless told otherwise: the legacy default stream.
CUstream const kStream = nullptr;
constexpr int kDevice = 0;

// Every driver entry point spillway can call (the list the shim builds its
// driver table from).
constexpr const char* kEntryPoints[] = {
#define DRIVER_ENTRY_POINT(name) #name,
#include "driver_entry_points.def"
#undef DRIVER_ENTRY_POINT
};

// Set when any benchmark fails, so the run exits non-zero.
bool g_failed = false;
// The benchmark running now (they run one at a time), and those that failed.
std::string g_current;
std::set<std::string> g_failed_benchmarks;

void fail(benchmark::State& state, const std::string& why) {
  g_failed = true;
  g_failed_benchmarks.insert(g_current);
  // Printed now as well: the reporter shows errors only after the
  // repetitions, and not at all if something goes wrong before that.
  std::fprintf(stderr, "bench_allocator: %s: %s\n", g_current.c_str(), why.c_str());
  state.SkipWithError(why.c_str());
}

// Starts a run of the benchmark named `key`. Once it has failed, its later
// runs fail too: a median of the runs that happened to pass would hide the
// failure (and Google Benchmark 1.7.1 crashes computing the statistics when
// the first repetition failed and later ones did not).
bool begin(benchmark::State& state, std::string key) {
  g_current = std::move(key);
  if (!g_failed_benchmarks.count(g_current)) return true;
  state.SkipWithError("failed in an earlier repetition");
  return false;
}

std::vector<uint64_t> driver_call_counts() {
  std::vector<uint64_t> n;
  for (const char* name : kEntryPoints) n.push_back(simcuda_call_count(name));
  return n;
}

// Counts driver calls across a timed loop; the steady state must make none.
class NoDriverCalls {
 public:
  NoDriverCalls() : creates_(simcuda_call_count("cuMemCreate")), calls_(driver_call_counts()) {}
  // Fails the benchmark if the loop reached the driver, naming the calls.
  void check(benchmark::State& state) const {
    const uint64_t creates = simcuda_call_count("cuMemCreate") - creates_;
    const std::vector<uint64_t> calls = driver_call_counts();
    std::string which;
    for (size_t i = 0; i < calls.size(); ++i)
      if (calls[i] != calls_[i])
        which += std::string(which.empty() ? "" : ", ") + kEntryPoints[i] + " x" +
                 std::to_string(calls[i] - calls_[i]);
    if (creates == 0 && which.empty()) return;
    fail(state, "the timed loop called the driver (" + which + "): not a steady state");
  }

 private:
  uint64_t creates_;
  std::vector<uint64_t> calls_;
};

// Waits until no driver call has been made for 50 ms (at most 2 s): true if
// the driver went quiet.
bool driver_quiet() {
  for (int i = 0; i < 40; ++i) {
    const std::vector<uint64_t> before = driver_call_counts();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (driver_call_counts() == before) return true;
  }
  return false;
}

// The simulated device, set up once: cuInit and the primary context of
// device 0, current on the calling thread (as PyTorch has it).
struct Device {
  CUcontext ctx = nullptr;
  const spillway::cu::Driver* driver = nullptr;
  uint64_t total = 0;
  std::string error;
};

const Device& device() {
  static const Device dev = [] {
    Device d;
    CUdevice cu_dev = 0;
    size_t total = 0;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&cu_dev, kDevice) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&d.ctx, cu_dev) != CUDA_SUCCESS ||
        cuCtxSetCurrent(d.ctx) != CUDA_SUCCESS ||
        cuDeviceTotalMem(&total, cu_dev) != CUDA_SUCCESS) {
      d.error = "the simulated device could not be set up (SIMCUDA_LOG=1 says why)";
      return d;
    }
    d.total = total;
    std::string why;
    d.driver = spillway::cu::load(&why);
    if (!d.driver) d.error = "spillway::cu::load: " + why;
    return d;
  }();
  return dev;
}

// One allocator per benchmark (by name), kept for the whole run so its
// repetitions share the warm cache; never destroyed, like the shim's Runtime.
spillway::Allocator* allocator(const std::string& key, std::string* error) {
  // Heap-allocated and never destroyed either: the allocators stay reachable
  // until exit (no LeakSanitizer report in sanitizer builds).
  static auto& by_key = *new std::map<std::string, spillway::Allocator*>;
  if (auto it = by_key.find(key); it != by_key.end()) return it->second;
  const Device& dev = device();
  if (!dev.driver) {
    *error = dev.error;
    return nullptr;
  }
  spillway::AllocatorOptions o;
  o.device = kDevice;
  o.gpu_budget = spillway::default_gpu_budget(dev.total);  // what the shim uses by default
  o.host_budget = 64 * GiB;
  std::string why;
  std::unique_ptr<spillway::Allocator> a = spillway::Allocator::create(*dev.driver, o, &why);
  if (!a) {
    *error = "Allocator::create: " + why;
    return nullptr;
  }
  return by_key[key] = a.release();
}

// The in-process allocator, called as the shim calls it.
struct InProcess {
  spillway::Allocator* a;
  void* malloc(size_t size) const { return a->malloc(size, kStream); }
  void free(void* p, size_t size) const { a->free(p, size, kStream); }
};

// libspillway.so's exported C ABI, dlopened from this build.
struct Abi {
  using MallocFn = decltype(&spillway_malloc);
  using FreeFn = decltype(&spillway_free);
  MallocFn malloc_fn = nullptr;
  FreeFn free_fn = nullptr;
  void* malloc(size_t size) const { return malloc_fn(size, kDevice, kStream); }
  void free(void* p, size_t size) const { free_fn(p, size, kDevice, kStream); }
};

const Abi* abi(std::string* error) {
  static std::string load_error;
  static const Abi* loaded = []() -> const Abi* {
    if (!device().error.empty()) {
      load_error = device().error;
      return nullptr;
    }
    void* lib = dlopen(SPILLWAY_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* e = dlerror();
      load_error = std::string("dlopen ") + SPILLWAY_LIBRARY + ": " + (e ? e : "?");
      return nullptr;
    }
    auto a = std::make_unique<Abi>();
    a->malloc_fn = reinterpret_cast<Abi::MallocFn>(dlsym(lib, "spillway_malloc"));
    a->free_fn = reinterpret_cast<Abi::FreeFn>(dlsym(lib, "spillway_free"));
    if (!a->malloc_fn || !a->free_fn) {
      load_error = std::string(SPILLWAY_LIBRARY) + " does not export spillway_malloc/free";
      return nullptr;
    }
    // The library must drive the simulator this process counts calls of (it
    // dlopens libcuda.so.1, which is the one already loaded here): its first
    // large allocation has to show up as a cuMemCreate.
    const uint64_t creates = simcuda_call_count("cuMemCreate");
    void* p = a->malloc(4 * MiB);
    if (!p) {
      load_error = "spillway_malloc(4 MiB) through the ABI returned NULL (see the log above)";
      return nullptr;
    }
    a->free(p, 4 * MiB);
    if (simcuda_call_count("cuMemCreate") == creates) {
      load_error = "libspillway.so does not use this process's simulated driver";
      return nullptr;
    }
    // With access tracking (the default), the Runtime's allocator has a
    // background eviction thread that makes its context current when it
    // first wakes up (every 5 ms): a one-time call, not one of a pair's.
    if (!driver_quiet()) {
      load_error = "libspillway.so keeps calling the driver while idle";
      return nullptr;
    }
    // Say which configuration is timed: with access tracking (CUPTI found)
    // or blind.
    if (auto stats =
            reinterpret_cast<decltype(&spillway_stats_json)>(dlsym(lib, "spillway_stats_json"))) {
      std::string json(stats(nullptr, 0) + 1, '\0');
      stats(json.data(), json.size());
      const char* mode = json.find("\"blind\": 1") != std::string::npos   ? "blind"
                         : json.find("\"blind\": 0") != std::string::npos ? "on"
                                                                          : "unknown";
      std::fprintf(stderr, "bench_allocator: libspillway.so: access tracking %s\n", mode);
    }
    return a.release();
  }();
  if (!loaded) *error = load_error;
  return loaded;
}

// One step's allocations, in forward order; freed in reverse. Per layer of a
// small decoder (4096 tokens x hidden 4096, bf16): 16 small blocks from 512 B
// to 256 KiB (scalars, RNG seeds, layer-norm statistics, softmax statistics,
// index buffers) between 6 large ones of 10-192 MiB (hidden states, QKV,
// a chunk of attention scores, the MLP's up-projection, a dropout mask).
std::vector<size_t> transformer_step() {
  std::vector<size_t> step;
  for (int layer = 0; layer < 4; ++layer) {
    for (size_t s : {size_t{512}, 16 * KiB, 16 * KiB})  // seed, layer-norm mean/rstd
      step.push_back(s);
    step.push_back(32 * MiB);                                   // layer-norm output
    step.push_back(96 * MiB);                                   // QKV projection
    for (size_t s : {32 * KiB, size_t{512}, 1 * KiB, 2 * KiB})  // rotary indices, scalars
      step.push_back(s);
    step.push_back(128 * MiB);                        // attention scores, one chunk of heads
    for (size_t s : {256 * KiB, 256 * KiB, 4 * KiB})  // softmax max/sum, workspace
      step.push_back(s);
    step.push_back(10 * MiB + 512 * KiB);  // dropout mask (not a granule multiple)
    step.push_back(32 * MiB);              // attention output
    for (size_t s : {16 * KiB, 16 * KiB, 8 * KiB, 64 * KiB, 128 * KiB, size_t{512}})
      step.push_back(s);        // second layer-norm statistics, bias/scale buffers, loss scale
    step.push_back(192 * MiB);  // MLP up-projection
  }
  return step;
}

// Times the benchmark's loop a second time, to report per pair as plain
// numbers: wall-clock and this thread's CPU time, in nanoseconds.
class PairTimer {
 public:
  PairTimer() : wall_(std::chrono::steady_clock::now()), cpu_(thread_cpu_ns()) {}
  void report(benchmark::State& state, uint64_t pairs_per_iteration) const {
    const double wall =
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - wall_).count();
    const double cpu = thread_cpu_ns() - cpu_;
    const auto pairs = static_cast<double>(state.iterations() * pairs_per_iteration);
    state.SetItemsProcessed(static_cast<int64_t>(pairs));
    if (pairs == 0) return;
    state.counters["ns_per_pair"] = wall / pairs;
    state.counters["cpu_ns_per_pair"] = cpu / pairs;
  }

 private:
  static double thread_cpu_ns() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) * 1e9 + static_cast<double>(t.tv_nsec);
  }
  std::chrono::steady_clock::time_point wall_;
  double cpu_;
};

template <class Alloc>
void pairs_of_one_size(benchmark::State& state, const Alloc& a) {
  const auto size = static_cast<size_t>(state.range(0));
  for (int i = 0; i < 64; ++i) {  // warm-up: the block is cached after the first
    void* p = a.malloc(size);
    if (!p) {
      fail(state, "malloc returned NULL during warm-up");
      return;
    }
    a.free(p, size);
  }
  const NoDriverCalls guard;
  const PairTimer timer;
  for (auto _ : state) {
    // const: DoNotOptimize's read-only overload. The read-write one ("+m,r")
    // is miscompiled by GCC 12 under -fsanitize=address: free got a stack
    // address instead of p.
    void* const p = a.malloc(size);
    benchmark::DoNotOptimize(p);
    a.free(p, size);
  }
  timer.report(state, 1);
  guard.check(state);
}

template <class Alloc>
void transformer_steps(benchmark::State& state, const Alloc& a) {
  static const std::vector<size_t> step = transformer_step();
  std::vector<void*> ptrs(step.size());
  auto run_step = [&] {
    for (size_t i = 0; i < step.size(); ++i) ptrs[i] = a.malloc(step[i]);
    benchmark::DoNotOptimize(ptrs.data());
    for (size_t i = step.size(); i-- > 0;) a.free(ptrs[i], step[i]);
  };
  for (int i = 0; i < 3; ++i) {  // warm-up: the first step fills the caches
    run_step();
    for (void* p : ptrs)
      if (!p) {
        fail(state, "malloc returned NULL during warm-up");
        return;
      }
  }
  const NoDriverCalls guard;
  const PairTimer timer;
  for (auto _ : state) run_step();
  timer.report(state, step.size());
  guard.check(state);
}

void BM_MallocFreePair(benchmark::State& state) {
  if (!begin(state, "pair/" + std::to_string(state.range(0)))) return;
  std::string error;
  spillway::Allocator* a = allocator(g_current, &error);
  if (!a) return fail(state, error);
  pairs_of_one_size(state, InProcess{a});
}

void BM_TransformerStepMix(benchmark::State& state) {
  if (!begin(state, "mix")) return;
  std::string error;
  spillway::Allocator* a = allocator(g_current, &error);
  if (!a) return fail(state, error);
  transformer_steps(state, InProcess{a});
}

// Through libspillway.so: one process-wide allocator (the Runtime's) for all.
void BM_AbiPair(benchmark::State& state) {
  if (!begin(state, "abi/" + std::to_string(state.range(0)))) return;
  std::string error;
  const Abi* a = abi(&error);
  if (!a) return fail(state, error);
  pairs_of_one_size(state, *a);
}

void BM_AbiTransformerStepMix(benchmark::State& state) {
  if (!begin(state, "abi-mix")) return;
  std::string error;
  const Abi* a = abi(&error);
  if (!a) return fail(state, error);
  transformer_steps(state, *a);
}

// Medians (with mean and stddev) of 5 repetitions; short runs, so the whole
// executable stays well under a minute on 2 cores.
void configure(benchmark::internal::Benchmark* b) {
  b->MinTime(0.2)->Repetitions(5)->ReportAggregatesOnly(true)->UseRealTime();
}

void sizes(benchmark::internal::Benchmark* b) {
  for (int64_t s : {int64_t{512}, int64_t{64 * KiB}, int64_t{4 * MiB}, int64_t{64 * MiB}})
    b->Arg(s);
  configure(b);
}

BENCHMARK(BM_MallocFreePair)->Apply(sizes);
BENCHMARK(BM_TransformerStepMix)->Apply(configure);
BENCHMARK(BM_AbiPair)->Apply(sizes);
BENCHMARK(BM_AbiTransformerStepMix)->Apply(configure);

}  // namespace

int main(int argc, char** argv) {
  // libspillway.so reads SPILLWAY_* at its first call. Its defaults apply,
  // except a budget large enough that nothing is ever evicted (an explicit
  // setting in the environment wins; the driver-call check then tells).
  setenv("SPILLWAY_GPU_BUDGET", "95%", /*overwrite=*/0);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (!device().error.empty()) {
    std::fprintf(stderr, "bench_allocator: %s\n", device().error.c_str());
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return g_failed ? 1 : 0;
}
