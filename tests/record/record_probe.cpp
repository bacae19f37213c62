// record_probe LIB: a tiny "training job" over libspillway.so (dlopened, as a
// preload would be) and the simulated driver, for test_record.cpp. It
// allocates, launches a kernel and a memset on the blocks, marks a step and
// frees, in a fixed order the test knows.
#include <cuda.h>
#include <dlfcn.h>
#include <simcuda.h>
#include <spillway.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace {
void noop(const void*, size_t, const simcuda_launch_info*, void*) {}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 3;
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::fprintf(stderr, "%s\n", dlerror());
    return 4;
  }
  auto sp_malloc = reinterpret_cast<decltype(&spillway_malloc)>(dlsym(lib, "spillway_malloc"));
  auto sp_free = reinterpret_cast<decltype(&spillway_free)>(dlsym(lib, "spillway_free"));
  auto sp_step = reinterpret_cast<decltype(&spillway_mark_step)>(dlsym(lib, "spillway_mark_step"));
  if (!sp_malloc || !sp_free || !sp_step) return 4;
  constexpr size_t kBig = 4u << 20, kSmall = 4096;
  char* a = static_cast<char*>(sp_malloc(kBig, 0, nullptr));  // starts CUDA and the tracker
  char* b = static_cast<char*>(sp_malloc(kBig, 0, nullptr));
  char* c = static_cast<char*>(sp_malloc(kSmall, 0, nullptr));
  if (!a || !b || !c) return 5;
  static const size_t sizes[] = {8, 8, 8};
  simcuda_kernel_desc d{};
  d.name = "probe_kernel";
  d.fn = noop;
  d.param_sizes = sizes;
  d.num_params = 3;
  d.duration_ns = 7000;
  CUfunction f = nullptr;
  if (simcuda_register_function(&d, &f) != CUDA_SUCCESS) return 6;
  char* b_inner = b + 100;
  void* args1[] = {&a, &b_inner, &c};
  if (cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, args1, nullptr) != CUDA_SUCCESS) return 7;
  if (cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(b) + 4096, 0, 16, nullptr) != CUDA_SUCCESS)
    return 7;
  sp_step();
  if (cuCtxSynchronize() != CUDA_SUCCESS) return 8;
  sp_free(a, kBig, 0, nullptr);
  void* args2[] = {&b, &b, &c};
  if (cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, args2, nullptr) != CUDA_SUCCESS) return 7;
  if (cuCtxSynchronize() != CUDA_SUCCESS) return 8;
  sp_free(b, kBig, 0, nullptr);
  sp_free(c, kSmall, 0, nullptr);
  std::puts("done");
  std::fflush(stdout);
  // RECORD_PROBE_END: how the job ends. Unset: returning from main (atexit
  // closes the record); "term": killed by SIGTERM (spillway's handler
  // closes it); "kill": killed by SIGKILL once the recorder's writer has
  // drained (nothing closes it).
  const char* end = std::getenv("RECORD_PROBE_END");
  if (end && std::strcmp(end, "term") == 0) raise(SIGTERM);
  if (end && std::strcmp(end, "kill") == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    raise(SIGKILL);
  }
  return 0;
}
