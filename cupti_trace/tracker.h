// Access tracking through CUPTI callbacks: before every kernel launch, copy
// and set, find which of spillway's blocks it may touch and tell the sink, so
// evicted blocks are restored (and evictions in flight cancelled) before the
// work is queued, and every stream that uses a block is known (design.md 5).
//
// Launch arguments are scanned with the kernel's parameter layout
// (cuFuncGetParamInfo, or cuKernelGetParamInfo for a CUkernel), cached per
// function: every 8-byte-aligned word of the packed arguments is a candidate
// pointer, interior pointers included; `extra` buffers are scanned whole.
// Runtime launches are scanned at the driver launch the runtime makes inside
// them (CUDA 13's `__cudaLaunchKernel`, which names a CUkernel, at the runtime
// callback); spillway never calls the CUDA runtime, whose error state is the
// job's. Work captured into a CUDA graph holds its blocks resident for as
// long as the graph or an executable made from it exists.
#pragma once

#include <cuda.h>
#include <cupti.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "access.h"
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

  // spillway's own driver calls (under InternalCalls, or made inside a
  // callback) are not tracked, but `hook` sees them at enter, so that a trace
  // writer can find their activity records by correlation id. Set it before
  // the first allocation; it must be quick and must not call CUDA.
  using InternalCallHook = void (*)(void* ctx, CUpti_CallbackId cbid, const CUpti_CallbackData* cb);
  void set_internal_call_hook(InternalCallHook hook, void* ctx) {
    hook_ctx_ = ctx;
    hook_.store(hook, std::memory_order_release);
  }

  uint64_t launches_seen() const { return launches_.load(std::memory_order_relaxed); }
  // Every launch, copy and set is numbered from one counter, reported or not
  // (Access::seq); work spillway itself reports (NCCL calls) takes its number
  // from here too, so the policy sees one order. last_seq: the latest given.
  uint64_t next_seq() { return seq_.fetch_add(1, std::memory_order_relaxed) + 1; }
  uint64_t last_seq() const { return seq_.load(std::memory_order_relaxed); }
  uint64_t touches_reported() const { return touches_.load(std::memory_order_relaxed); }
  // Runtime launches that returned success with no driver launch callback
  // inside them: not scanned (design.md 5; none on the drivers checked).
  uint64_t unseen_runtime_launches() const {
    return unseen_runtime_launches_.load(std::memory_order_relaxed);
  }

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
  // Returns whether the runtime launch was scanned.
  bool on_runtime_launch(CUpti_CallbackId cbid, const void* params);
  void on_unseen_runtime_launch(const CUpti_CallbackData* cb);
  // Capture and graph calls; false if `cbid` is not one.
  bool on_graph_call(CUpti_CallbackId cbid, const CUpti_CallbackData* cb);
  // To the sink: before_use, or a hold when the stream is capturing.
  // The call that before_use held ranges for has returned: release them.
  void release_held();
  void deliver(const Access& a, const Touch* t, size_t n);
  const Layout& layout(CUfunction f);
  void report(Access::Kind kind, const Touch* t, size_t n, CUstream stream);

  const cupti::Api& api_;
  const cu::Driver& d_;
  AccessSink& sink_;
  CUpti_SubscriberHandle subscriber_ = nullptr;
  std::mutex layouts_mu_;
  std::unordered_map<CUfunction, std::unique_ptr<Layout>> layouts_;
  std::atomic<uint64_t> launches_{0}, touches_{0}, seq_{0}, unseen_runtime_launches_{0};
  std::atomic<InternalCallHook> hook_{nullptr};
  void* hook_ctx_ = nullptr;
  // CUDA graphs: the ranges touched by work captured so far (by capture id),
  // and those each graph and executable graph holds resident.
  std::atomic<int> capturing_{0};
  std::mutex graphs_mu_;
  std::unordered_map<CUstream, cuuint64_t> origins_;  // capturing stream -> capture id
  std::unordered_map<cuuint64_t, std::vector<Touch>> captures_;
  std::unordered_map<CUgraph, std::vector<Touch>> graphs_;
  std::unordered_map<CUgraphExec, std::vector<Touch>> execs_;
};

}  // namespace spillway
