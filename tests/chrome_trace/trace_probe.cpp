// trace_probe: a job for tests/chrome_trace, in a process of its own.
//
//   trace_probe LIB MODE [LAUNCHES]
//
// Loads LIB (libspillway.so) with dlopen, allocates 8 blocks of 4 MiB on a
// stream through spillway_malloc (the test sets a budget below that, so
// blocks are evicted), and runs real cuLaunchKernel launches over them in
// rounds (the tracker restores each block before its kernel), plus a memset
// and a memcpy. Then frees everything, synchronizes and prints
// "stats <spillway_stats_json>". MODE:
//   run       then returns from main (atexit handlers run)
//   hold      then prints "ready" and waits for a signal (SIGTERM, SIGKILL)
//   hold_int  installs its own SIGINT handler first; prints "ready", waits
//             for SIGINT, prints "interrupted", returns from main
//   long      LAUNCHES launches of one kernel on one resident block, no
//             eviction, then as `run`
#include <cuda.h>
#include <dlfcn.h>
#include <signal.h>
#include <simcuda.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using MallocFn = void* (*)(size_t, int, CUstream);
using FreeFn = void (*)(void*, size_t, int, CUstream);
using StatsFn = size_t (*)(char*, size_t);

volatile sig_atomic_t g_interrupted = 0;
void on_int(int) {
  g_interrupted = 1;
}

std::atomic<uint64_t> g_sum{0};
struct TouchArgs {
  const uint64_t* p;
  uint64_t bytes;
};
void touch_fn(const void* params, size_t, const simcuda_launch_info*, void*) {
  TouchArgs a;
  std::memcpy(&a, params, sizeof a);
  g_sum += a.p[0] + a.p[a.bytes / 8 - 1];
}

int fail(const char* what, int code = 1) {
  std::fprintf(stderr, "trace_probe: %s\n", what);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return fail("usage: trace_probe LIB MODE [LAUNCHES]", 3);
  const std::string mode = argv[2];
  const long launches = argc > 3 ? std::atol(argv[3]) : 0;
  if (mode == "hold_int") {
    struct sigaction sa {};
    sa.sa_handler = on_int;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) return fail(dlerror(), 4);
  auto sp_malloc = reinterpret_cast<MallocFn>(dlsym(lib, "spillway_malloc"));
  auto sp_free = reinterpret_cast<FreeFn>(dlsym(lib, "spillway_free"));
  auto sp_stats = reinterpret_cast<StatsFn>(dlsym(lib, "spillway_stats_json"));
  if (!sp_malloc || !sp_free || !sp_stats) return fail("missing symbols", 4);

  // The first malloc starts spillway (and its trace) and makes the primary
  // context current on this thread.
  constexpr size_t kSmall = 4096;
  void* first = sp_malloc(kSmall, 0, nullptr);
  if (!first) return fail("first malloc");
  CUstream s = nullptr;
  if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return fail("cuStreamCreate");
  static const size_t sizes[] = {8, 8};
  simcuda_kernel_desc d{};
  d.name = "touch_block";
  d.fn = touch_fn;
  d.param_sizes = sizes;
  d.num_params = 2;
  d.duration_ns = 20000;
  CUfunction touch = nullptr;
  if (simcuda_register_function(&d, &touch) != CUDA_SUCCESS) return fail("register");
  auto launch = [&](void* p, size_t bytes) {
    TouchArgs a{static_cast<const uint64_t*>(p), bytes};
    void* params[] = {&a.p, &a.bytes};
    return cuLaunchKernel(touch, 1, 1, 1, 32, 1, 1, 0, s, params, nullptr) == CUDA_SUCCESS;
  };

  constexpr size_t kBlock = 4u << 20;
  std::vector<void*> blocks;
  if (mode == "long") {
    void* b = sp_malloc(kBlock, 0, s);
    if (!b) return fail("malloc");
    blocks.push_back(b);
    for (long i = 0; i < launches; ++i)
      if (!launch(b, kBlock)) return fail("launch");
  } else {
    for (int i = 0; i < 8; ++i) {
      void* b = sp_malloc(kBlock, 0, s);
      if (!b) return fail("malloc");
      blocks.push_back(b);
    }
    std::vector<uint8_t> host(kBlock, 7);
    for (int round = 0; round < 3; ++round)
      for (void* b : blocks)
        if (!launch(b, kBlock)) return fail("launch");
    if (cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(blocks[0]), 1, 4096, s) != CUDA_SUCCESS ||
        cuMemcpyHtoDAsync_v2(reinterpret_cast<CUdeviceptr>(blocks[1]), host.data(), 65536, s) !=
            CUDA_SUCCESS)
      return fail("memset/memcpy");
  }
  if (cuStreamSynchronize(s) != CUDA_SUCCESS) return fail("sync");
  for (void* b : blocks) sp_free(b, kBlock, 0, s);
  sp_free(first, kSmall, 0, nullptr);
  if (cuStreamSynchronize(s) != CUDA_SUCCESS) return fail("sync");
  std::vector<char> json(sp_stats(nullptr, 0) + 1);
  sp_stats(json.data(), json.size());
  std::printf("stats %s\n", json.empty() ? "" : json.data());
  std::fflush(stdout);
  if (mode == "hold" || mode == "hold_int") {
    std::printf("ready\n");
    std::fflush(stdout);
    while (!g_interrupted) usleep(10000);  // the signal may land on any thread
    std::printf("interrupted\n");
    std::fflush(stdout);
  }
  return 0;
}
