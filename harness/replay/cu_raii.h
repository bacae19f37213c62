// Owning wrappers for the CUDA objects the replayer creates itself (streams,
// events, pinned host buffers). The replayer links the simulated driver
// (build/sim/libcuda.so.1) directly and calls it through cuda.h.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <utility>

namespace replay {

class Stream {
 public:
  Stream() = default;
  explicit Stream(unsigned flags) {
    if (cuStreamCreate(&s_, flags) != CUDA_SUCCESS) s_ = nullptr;
  }
  ~Stream() {
    if (s_) cuStreamDestroy(s_);
  }
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    std::swap(s_, o.s_);
    return *this;
  }
  CUstream get() const { return s_; }
  explicit operator bool() const { return s_ != nullptr; }

 private:
  CUstream s_ = nullptr;
};

class Event {
 public:
  Event() = default;
  explicit Event(unsigned flags) {
    if (cuEventCreate(&e_, flags) != CUDA_SUCCESS) e_ = nullptr;
  }
  ~Event() {
    if (e_) cuEventDestroy(e_);
  }
  Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  Event& operator=(Event&& o) noexcept {
    std::swap(e_, o.e_);
    return *this;
  }
  CUevent get() const { return e_; }
  explicit operator bool() const { return e_ != nullptr; }

 private:
  CUevent e_ = nullptr;
};

// Page-locked host memory (cuMemHostAlloc), as PyTorch's pin_memory gives.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes) : n_(bytes) {
    if (cuMemHostAlloc(&p_, bytes ? bytes : 1, 0) != CUDA_SUCCESS) p_ = nullptr;
  }
  ~PinnedBuffer() {
    if (p_) cuMemFreeHost(p_);
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  void* get() const { return p_; }
  size_t size() const { return n_; }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// The primary context of `device`, retained and made current on this
// thread for the rest of the process, as PyTorch does: the shim uses the
// context it found current from its own threads (background eviction) until
// its exit handler runs, so releasing it when the replay ends would pull the
// context out from under them. The process exit tears it down.
inline CUresult retain_primary_context_for_process(int device = 0) {
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUresult r = cuInit(0);
  if (r == CUDA_SUCCESS) r = cuDeviceGet(&dev, device);
  if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&ctx, dev);
  if (r == CUDA_SUCCESS) r = cuCtxSetCurrent(ctx);
  return r;
}

}  // namespace replay
