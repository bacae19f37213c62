// Owning wrappers for the CUDA objects the shim creates.
#pragma once

#include <cuda.h>

#include <utility>

#include "driver.h"

namespace spillway {

class Stream {
 public:
  Stream() = default;
  Stream(const cu::Driver& d, unsigned flags) : d_(&d) {
    if (d.cuStreamCreate(&s_, flags) != CUDA_SUCCESS) s_ = nullptr;
  }
  ~Stream() {
    if (s_) d_->cuStreamDestroy(s_);
  }
  Stream(Stream&& o) noexcept : d_(o.d_), s_(std::exchange(o.s_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    std::swap(d_, o.d_);
    std::swap(s_, o.s_);
    return *this;
  }
  CUstream get() const { return s_; }
  explicit operator bool() const { return s_ != nullptr; }

 private:
  const cu::Driver* d_ = nullptr;
  CUstream s_ = nullptr;
};

class Event {
 public:
  Event() = default;
  explicit Event(const cu::Driver& d) : d_(&d) {
    if (d.cuEventCreate(&e_, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) e_ = nullptr;
  }
  ~Event() {
    if (e_) d_->cuEventDestroy(e_);
  }
  Event(Event&& o) noexcept : d_(o.d_), e_(std::exchange(o.e_, nullptr)) {}
  Event& operator=(Event&& o) noexcept {
    std::swap(d_, o.d_);
    std::swap(e_, o.e_);
    return *this;
  }
  CUevent get() const { return e_; }
  explicit operator bool() const { return e_ != nullptr; }

 private:
  const cu::Driver* d_ = nullptr;
  CUevent e_ = nullptr;
};

}  // namespace spillway
