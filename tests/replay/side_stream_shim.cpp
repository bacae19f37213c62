// A stand-in for libspillway.so that does one thing spillway does: queue
// copies of its own on a stream of its own. Each step mark queues a 50 MB
// host-to-device copy (50 ms at SIMCUDA_H2D_GBPS=1, simulated) on a
// non-blocking stream, so that a replay shows whether a step's end waits for
// it (--step-sync context) or not (streams). Memory comes from cuMemAlloc
// and is never freed: the test's record is small, and a free would need the
// queued work that uses it to end first. Its statistics count the marks
// (`steps_marked`).
#include <cuda.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>

namespace {
constexpr size_t kSideCopyBytes = 50'000'000;
int marks = 0;  // the replayer marks from one thread

struct Side {
  CUstream stream = nullptr;
  void* host = nullptr;
  CUdeviceptr dev = 0;
  Side() {
    if (cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
        cuMemHostAlloc(&host, kSideCopyBytes, 0) != CUDA_SUCCESS ||
        cuMemAlloc(&dev, kSideCopyBytes) != CUDA_SUCCESS)
      std::abort();
  }
};

Side& side() {
  static Side s;
  return s;
}
}  // namespace

extern "C" {
__attribute__((visibility("default"))) void* spillway_malloc(size_t size, int, CUstream) {
  CUdeviceptr p = 0;
  return cuMemAlloc(&p, size ? size : 1) == CUDA_SUCCESS ? reinterpret_cast<void*>(p) : nullptr;
}

__attribute__((visibility("default"))) void spillway_free(void*, size_t, int, CUstream) {}

__attribute__((visibility("default"))) void spillway_mark_step() {
  Side& s = side();
  ++marks;
  if (cuMemcpyHtoDAsync(s.dev, s.host, kSideCopyBytes, s.stream) != CUDA_SUCCESS) std::abort();
}

__attribute__((visibility("default"))) size_t spillway_stats_json(char* buf, size_t size) {
  const int n = std::snprintf(buf, buf ? size : 0, "{\"steps_marked\": %d}", marks);
  return n < 0 ? 0 : static_cast<size_t>(n);
}
}
