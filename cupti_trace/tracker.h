// Access tracking through CUPTI callbacks: before every kernel launch, copy
// and set, find which of spillway's blocks it may touch and tell the sink, so
// evicted blocks are restored (and evictions in flight cancelled) before the
// work is queued, and every stream that uses a block is known (design.md 5).
//
// Launch arguments are scanned with the kernel's parameter layout
// (cuFuncGetParamInfo, or cuKernelGetParamInfo for a CUkernel), cached per
// function: every 8-byte-aligned word of the packed arguments is a candidate
// pointer, interior pointers included; `extra` buffers are scanned whole.
// Only the driver domain is subscribed: runtime launches reach the driver.
#pragma once

#include <cuda.h>
#include <cupti.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "access_sink.h"
#include "cupti_api.h"
#include "driver.h"

namespace spillway {

class Tracker {
 public:
  // Subscribes. nullptr and a reason if CUPTI cannot be had (another
  // subscriber, no library): the caller then runs blind, which stays correct
  // for reads of evicted blocks (they are mapped at their address).
  static std::unique_ptr<Tracker> start(const cupti::Api& api, const cu::Driver& d,
                                        AccessSink& sink, std::string* why);
  ~Tracker();
  Tracker(const Tracker&) = delete;
  Tracker& operator=(const Tracker&) = delete;

  uint64_t launches_seen() const { return launches_.load(std::memory_order_relaxed); }
  uint64_t touches_reported() const { return touches_.load(std::memory_order_relaxed); }

  // The parameter layout of a kernel: (offset, size) of each parameter.
  struct Layout {
    std::vector<std::pair<uint32_t, uint32_t>> params;
    bool known = false;
    const char* name = nullptr;
  };
  // Exposed for the scan benchmark and tests.
  void scan_launch(CUfunction f, void** kernel_params, void** extra, CUstream stream);

 private:
  Tracker(const cupti::Api& api, const cu::Driver& d, AccessSink& sink)
      : api_(api), d_(d), sink_(sink) {}
  static void CUPTIAPI callback(void* self, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                const void* data);
  void on_driver_call(CUpti_CallbackId cbid, const void* params);
  const Layout& layout(CUfunction f);
  void report(Access::Kind kind, const Touch* t, size_t n, CUstream stream);

  const cupti::Api& api_;
  const cu::Driver& d_;
  AccessSink& sink_;
  CUpti_SubscriberHandle subscriber_ = nullptr;
  std::mutex layouts_mu_;
  std::unordered_map<CUfunction, std::unique_ptr<Layout>> layouts_;
  std::atomic<uint64_t> launches_{0}, touches_{0}, seq_{0};
};

}  // namespace spillway
