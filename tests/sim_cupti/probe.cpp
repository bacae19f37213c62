// Usage: sim_cupti_probe LIBCUPTI [LIBCUDA]
// Loads LIBCUDA (if given) and then LIBCUPTI by full path, and prints one line
// "<function> <CUptiResult>" per call. Exit status 0 when every symbol was
// found; the caller judges the results.
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>

#include <cupti.h>

namespace {

template <class F>
F symbol(void* lib, const char* name) {
  void* p = dlsym(lib, name);
  if (p == nullptr) std::fprintf(stderr, "missing %s\n", name);
  return reinterpret_cast<F>(p);
}

void CUPTIAPI on_callback(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void*) {}
void CUPTIAPI on_request(uint8_t** buffer, size_t* size, size_t* max) {
  *buffer = nullptr;
  *size = 0;
  *max = 0;
}
void CUPTIAPI on_complete(CUcontext, uint32_t, uint8_t*, size_t, size_t) {}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s LIBCUPTI [LIBCUDA]\n", argv[0]);
    return 2;
  }
  if (argc == 3 && dlopen(argv[2], RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    std::fprintf(stderr, "%s\n", dlerror());
    return 2;
  }
  void* cupti = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (cupti == nullptr) {
    std::fprintf(stderr, "%s\n", dlerror());
    return 2;
  }
  auto subscribe = symbol<decltype(&cuptiSubscribe)>(cupti, "cuptiSubscribe");
  auto enable = symbol<decltype(&cuptiActivityEnable)>(cupti, "cuptiActivityEnable");
  auto reg =
      symbol<decltype(&cuptiActivityRegisterCallbacks)>(cupti, "cuptiActivityRegisterCallbacks");
  auto timestamp = symbol<decltype(&cuptiGetTimestamp)>(cupti, "cuptiGetTimestamp");
  auto last_error = symbol<decltype(&cuptiGetLastError)>(cupti, "cuptiGetLastError");
  if (!subscribe || !enable || !reg || !timestamp || !last_error) return 3;

  CUpti_SubscriberHandle subscriber = nullptr;
  std::printf("cuptiSubscribe %d\n", subscribe(&subscriber, on_callback, nullptr));
  std::printf("cuptiActivityEnable %d\n", enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  std::printf("cuptiActivityRegisterCallbacks %d\n", reg(on_request, on_complete));
  uint64_t now = 0;
  std::printf("cuptiGetTimestamp %d\n", timestamp(&now));
  std::printf("cuptiGetLastError %d\n", last_error());
  return 0;
}
