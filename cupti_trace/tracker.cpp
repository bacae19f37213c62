#include "tracker.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "log.h"

namespace spillway {
namespace {

// Driver calls made while handling a callback (cuFuncGetParamInfo, a
// restore's cuMemMap...) fire callbacks too: ignore those.
thread_local bool t_in_callback = false;
// Runtime launches scanned on this thread and not yet returned: the driver
// launch the runtime makes inside one is the same launch (de-duplicated by
// nesting, not by correlation id: cupti_callbacks.h gives each API call its
// own, while an H100 with driver 580 gave the nested pair the same one,
// docs/gpu.md).
thread_local int t_runtime_scanned = 0;
// Launches scanned on this thread: a runtime launch that returns without one
// nested in it was never seen by the driver callbacks.
thread_local uint64_t t_launches_scanned = 0;
// correlationData of a runtime launch: this bit when it was scanned there,
// else the thread's t_launches_scanned at its enter.
constexpr uint64_t kScannedAtRuntime = uint64_t{1} << 63;

// The callbacks spillway needs, and only those (design.md 5).
constexpr CUpti_CallbackId kLaunches[] = {
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
};
constexpr CUpti_CallbackId kCopiesAndSets[] = {
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD16_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD16_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async_ptsz,
};

// Runtime-domain launches (design.md 5). `__cudaLaunchKernel` names a
// CUkernel the driver can query, so it is scanned there and the driver launch
// made inside it skipped. The others name a host stub only libcudart can map
// to a function, and spillway never calls the runtime: its lookup failing
// sets the job's cudaGetLastError (a preloaded spillway made PyTorch raise
// "invalid device function" on an H100, docs/gpu.md). Their nested driver
// launch is scanned instead, and one that never comes is counted.
constexpr CUpti_CallbackId kRuntimeLaunches[] = {
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060,
    CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000,
    CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000,
};
// Graphs: what is captured, what is instantiated, launched and destroyed.
constexpr CUpti_CallbackId kGraphs[] = {
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture,
    CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithFlags,
    CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithParams,
    CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithParams_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiate_v2,
    CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch,
    CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuGraphExecDestroy,
    CUPTI_DRIVER_TRACE_CBID_cuGraphDestroy,
};

// A _ptsz/_ptds call with a NULL stream means the thread's default stream.
CUstream per_thread(CUstream s) {
  return s ? s : CU_STREAM_PER_THREAD;
}

// Ranges before_use held for calls not yet returned, released at the call's
// exit callback (the work is queued by then): the ranges, and per call its
// correlation id, stream and first range. A stack: a runtime launch's driver
// call nests inside it.
struct HeldCall {
  uint32_t correlation;
  CUstream stream;
  size_t first;
};
thread_local std::vector<Touch> t_held;
thread_local std::vector<HeldCall> t_held_calls;

struct Scope {
  Scope() { t_in_callback = true; }
  ~Scope() {
    t_in_callback = false;
    CurrentCall::set_correlation(0);
  }
};

}  // namespace

std::unique_ptr<Tracker> Tracker::start(const cupti::Api& api, const cu::Driver& d,
                                        AccessSink& sink, std::string* why) {
  std::unique_ptr<Tracker> t(new Tracker(api, d, sink));
  CUptiResult r = api.cuptiSubscribe(&t->subscriber_, &Tracker::callback, t.get());
  auto text = [&](CUptiResult e) {
    const char* s = nullptr;
    api.cuptiGetResultString(e, &s);
    return std::string(s ? s : "unknown CUPTI error");
  };
  if (r != CUPTI_SUCCESS) {
    *why = r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
               ? "another CUPTI client (a profiler?) is subscribed"
               : "cuptiSubscribe failed: " + text(r);
    return nullptr;
  }
  auto enable = [&](CUpti_CallbackId id) {
    CUptiResult e = api.cuptiEnableCallback(1, t->subscriber_, CUPTI_CB_DOMAIN_DRIVER_API, id);
    if (e != CUPTI_SUCCESS && why->empty()) *why = "cuptiEnableCallback failed: " + text(e);
    return e == CUPTI_SUCCESS;
  };
  bool ok = true;
  for (CUpti_CallbackId id : kLaunches) ok = enable(id) && ok;
  for (CUpti_CallbackId id : kCopiesAndSets) ok = enable(id) && ok;
  for (CUpti_CallbackId id : kGraphs) ok = enable(id) && ok;
  if (!ok) return nullptr;  // the destructor unsubscribes
  // The runtime domain is optional: the driver callbacks see every launch
  // the runtime makes on the drivers checked (a refusal here only loses the
  // count of runtime launches they did not see).
  for (CUpti_CallbackId id : kRuntimeLaunches)
    if (api.cuptiEnableCallback(1, t->subscriber_, CUPTI_CB_DOMAIN_RUNTIME_API, id) !=
        CUPTI_SUCCESS)
      log::debug("runtime-domain callback {} not enabled", id);
  return t;
}

Tracker::~Tracker() {
  if (subscriber_) api_.cuptiUnsubscribe(subscriber_);
}

void CUPTIAPI Tracker::callback(void* self, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                const void* data) {
  const auto* cb = static_cast<const CUpti_CallbackData*>(data);
  auto* t = static_cast<Tracker*>(self);
  if (t_in_callback || InternalCalls::active()) {
    InternalCallHook hook = t->hook_.load(std::memory_order_acquire);
    if (hook && domain == CUPTI_CB_DOMAIN_DRIVER_API && cb->callbackSite == CUPTI_API_ENTER)
      hook(t->hook_ctx_, cbid, cb);
    return;
  }
  if (cb->callbackSite == CUPTI_API_EXIT && !t_held_calls.empty() &&
      t_held_calls.back().correlation == cb->correlationId)
    t->release_held();
  CurrentCall::set_correlation(cb->correlationId);
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
    if (cb->callbackSite == CUPTI_API_ENTER) {
      Scope scope;
      const bool scanned = t->on_runtime_launch(cbid, cb->functionParams);
      *cb->correlationData = scanned ? kScannedAtRuntime : t_launches_scanned;
      t_runtime_scanned += scanned ? 1 : 0;
    } else if (*cb->correlationData == kScannedAtRuntime) {
      --t_runtime_scanned;
    } else if (*cb->correlationData == t_launches_scanned) {
      t->on_unseen_runtime_launch(cb);
    }
    return;
  }
  if (domain != CUPTI_CB_DOMAIN_DRIVER_API) return;
  Scope scope;
  CurrentCall::set_correlation(cb->correlationId);
  if (t->on_graph_call(cbid, cb)) return;
  // Before the call: the work is not queued yet, so a restore is in time.
  if (cb->callbackSite != CUPTI_API_ENTER) return;
  t->on_driver_call(cbid, cb->functionParams);
}

bool Tracker::on_runtime_launch(CUpti_CallbackId cbid, const void* p) {
  CUfunction f = nullptr;
  void** args = nullptr;
  CUstream stream = nullptr;
  bool per_thread_stream = false;
  switch (cbid) {
    case CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000:
      per_thread_stream = true;
      [[fallthrough]];
    case CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000: {
      // No params struct in the headers: the arguments are laid out as the
      // signature in crt/device_functions.h (cudaKernel_t is a CUkernel,
      // which the driver's parameter queries take).
      struct Params {
        cudaKernel_t kernel;
        dim3 gridDim, blockDim;
        void** args;
        size_t sharedMem;
        cudaStream_t stream;
      };
      auto* a = static_cast<const Params*>(p);
      f = reinterpret_cast<CUfunction>(a->kernel);
      args = a->args;
      stream = a->stream;
      break;
    }
    default:
      return false;
  }
  if (!f) return false;
  scan_launch(f, args, nullptr, per_thread_stream ? per_thread(stream) : stream);
  return true;
}

void Tracker::deliver(const Access& a, const Touch* t, size_t n) {
  // Work queued into a stream capture runs whenever its graph is launched:
  // its blocks are held instead (and the capturing stream is not recorded as
  // a user: no event may be recorded on it outside the capture).
  if (capturing_.load(std::memory_order_acquire) > 0) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t id = 0;
    if (d_.cuStreamGetCaptureInfo(a.stream, &status, &id, nullptr, nullptr, nullptr, nullptr) ==
            CUDA_SUCCESS &&
        status == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
      {
        std::lock_guard lk(graphs_mu_);
        auto& held = captures_[id];
        held.insert(held.end(), t, t + n);
      }
      sink_.hold(t, n);
      return;
    }
  }
  // Only what was held needs releasing (a launch touching small blocks
  // alone costs no second taking of the lock).
  if (!sink_.before_use(a, t, n)) return;
  if (t_held_calls.empty() || t_held_calls.back().correlation != a.correlation)
    t_held_calls.push_back({a.correlation, a.stream, t_held.size()});
  t_held.insert(t_held.end(), t, t + n);
}

void Tracker::release_held() {
  const HeldCall call = t_held_calls.back();
  t_held_calls.pop_back();
  sink_.after_use(call.stream, t_held.data() + call.first, t_held.size() - call.first);
  t_held.resize(call.first);
}

bool Tracker::on_graph_call(CUpti_CallbackId cbid, const CUpti_CallbackData* cb) {
  const bool enter = cb->callbackSite == CUPTI_API_ENTER;
  const void* p = cb->functionParams;
  auto succeeded = [&] {
    return cb->functionReturnValue &&
           *static_cast<const CUresult*>(cb->functionReturnValue) == CUDA_SUCCESS;
  };
  auto capture_id = [&](CUstream s) -> cuuint64_t {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t id = 0;
    if (d_.cuStreamGetCaptureInfo(s, &status, &id, nullptr, nullptr, nullptr, nullptr) !=
            CUDA_SUCCESS ||
        status == CU_STREAM_CAPTURE_STATUS_NONE)
      return 0;
    return id;
  };
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph:
    case CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph_ptsz: {
      if (enter || !succeeded()) return true;
      // Both parameter structs start with the stream.
      auto* a = static_cast<const cuStreamBeginCapture_v2_params*>(p);
      const bool ptsz = cbid == CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2_ptsz ||
                        cbid == CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph_ptsz;
      const CUstream s = ptsz ? per_thread(a->hStream) : a->hStream;
      // The id is readable only while the capture is active (cuda.h,
      // cuStreamGetCaptureInfo): keep it for the end of the capture.
      const cuuint64_t id = capture_id(s);
      std::lock_guard lk(graphs_mu_);
      origins_[s] = id;
      capturing_.fetch_add(1, std::memory_order_acq_rel);
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture:
    case CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture_ptsz: {
      if (enter) return true;
      auto* a = static_cast<const cuStreamEndCapture_params*>(p);
      const CUstream s = cbid == CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture_ptsz
                             ? per_thread(a->hStream)
                             : a->hStream;
      std::vector<Touch> held;
      {
        std::lock_guard lk(graphs_mu_);
        auto origin = origins_.find(s);
        if (origin == origins_.end()) return true;  // not a capture we saw begin
        const cuuint64_t id = origin->second;
        origins_.erase(origin);
        capturing_.fetch_sub(1, std::memory_order_acq_rel);
        if (auto it = captures_.find(id); it != captures_.end()) {
          held = std::move(it->second);
          captures_.erase(it);
        }
        // The graph keeps the holds; a failed capture gives them back.
        if (succeeded() && a->phGraph && *a->phGraph) {
          auto& g = graphs_[*a->phGraph];
          g.insert(g.end(), held.begin(), held.end());
          return true;
        }
      }
      if (!held.empty()) sink_.release(held.data(), held.size());
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithFlags:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithParams:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithParams_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiate_v2: {
      if (enter || !succeeded()) return true;
      // Every instantiation variant starts with (CUgraphExec*, CUgraph).
      auto* a = static_cast<const cuGraphInstantiateWithFlags_params*>(p);
      std::vector<Touch> held;
      {
        std::lock_guard lk(graphs_mu_);
        auto it = graphs_.find(a->hGraph);
        if (it == graphs_.end() || !a->phGraphExec || !*a->phGraphExec) return true;
        held = it->second;
        execs_[*a->phGraphExec] = held;
      }
      // The executable outlives the graph it came from: it holds on its own.
      if (!held.empty()) sink_.hold(held.data(), held.size());
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz: {
      if (!enter) return true;
      auto* a = static_cast<const cuGraphLaunch_params*>(p);
      const CUstream s =
          cbid == CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz ? per_thread(a->hStream) : a->hStream;
      std::vector<Touch> used;
      {
        std::lock_guard lk(graphs_mu_);
        auto it = execs_.find(a->hGraph);
        if (it == execs_.end()) return true;
        used = it->second;
      }
      launches_.fetch_add(1, std::memory_order_relaxed);
      const Access access{Access::Kind::kGraphLaunch, s, nullptr,
                          seq_.fetch_add(1, std::memory_order_relaxed) + 1,
                          CurrentCall::correlation()};
      if (!used.empty()) deliver(access, used.data(), used.size());
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuGraphExecDestroy:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphDestroy: {
      if (!enter) return true;
      std::vector<Touch> held;
      {
        std::lock_guard lk(graphs_mu_);
        if (cbid == CUPTI_DRIVER_TRACE_CBID_cuGraphExecDestroy) {
          auto* a = static_cast<const cuGraphExecDestroy_params*>(p);
          if (auto it = execs_.find(a->hGraphExec); it != execs_.end()) {
            held = std::move(it->second);
            execs_.erase(it);
          }
        } else {
          auto* a = static_cast<const cuGraphDestroy_params*>(p);
          if (auto it = graphs_.find(a->hGraph); it != graphs_.end()) {
            held = std::move(it->second);
            graphs_.erase(it);
          }
        }
      }
      if (!held.empty()) sink_.release(held.data(), held.size());
      return true;
    }
    default:
      return false;
  }
}

void Tracker::report(Access::Kind kind, const Touch* t, size_t n, CUstream stream) {
  const uint64_t seq = seq_.fetch_add(1, std::memory_order_relaxed) + 1;
  size_t mine = 0;
  Touch kept[2];  // a copy has two sides, a set one
  for (size_t i = 0; i < n && i < 2; ++i)
    if (sink_.may_own(t[i].lo) || sink_.may_own(t[i].hi - 1)) kept[mine++] = t[i];
  if (mine == 0) return;
  touches_.fetch_add(mine, std::memory_order_relaxed);
  deliver(Access{kind, stream, nullptr, seq, CurrentCall::correlation()}, kept, mine);
}

void Tracker::on_driver_call(CUpti_CallbackId cbid, const void* p) {
  auto range = [](CUdeviceptr a, size_t n) { return Touch{a, a + (n ? n : 1)}; };
  // A launch the runtime makes for a runtime launch already scanned.
  if (t_runtime_scanned > 0) {
    for (CUpti_CallbackId id : kLaunches)
      if (id == cbid) return;
  }
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel: {
      auto* a = static_cast<const cuLaunchKernel_params*>(p);
      return scan_launch(a->f, a->kernelParams, a->extra, a->hStream);
    }
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz: {
      auto* a = static_cast<const cuLaunchKernel_ptsz_params*>(p);
      return scan_launch(a->f, a->kernelParams, a->extra, per_thread(a->hStream));
    }
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx: {
      auto* a = static_cast<const cuLaunchKernelEx_params*>(p);
      return scan_launch(a->f, a->kernelParams, a->extra, a->config ? a->config->hStream : nullptr);
    }
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz: {
      auto* a = static_cast<const cuLaunchKernelEx_ptsz_params*>(p);
      return scan_launch(a->f, a->kernelParams, a->extra,
                         per_thread(a->config ? a->config->hStream : nullptr));
    }
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel: {
      auto* a = static_cast<const cuLaunchCooperativeKernel_params*>(p);
      return scan_launch(a->f, a->kernelParams, nullptr, a->hStream);
    }
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz: {
      auto* a = static_cast<const cuLaunchCooperativeKernel_ptsz_params*>(p);
      return scan_launch(a->f, a->kernelParams, nullptr, per_thread(a->hStream));
    }
  }
    // Copies and sets: the device-side ranges, on the call's stream (the
    // legacy default stream, or the thread's own for _ptds/_ptsz, when none).
#define TRACK_COPY(id, type, dst, src, stream_expr)                    \
  case CUPTI_DRIVER_TRACE_CBID_##id: {                                 \
    auto* a = static_cast<const type*>(p);                             \
    Touch t[2] = {range(dst, a->ByteCount), range(src, a->ByteCount)}; \
    return report(Access::Kind::kCopy, t, 2, stream_expr);             \
  }
#define TRACK_SET(id, type, elem, stream_expr)            \
  case CUPTI_DRIVER_TRACE_CBID_##id: {                    \
    auto* a = static_cast<const type*>(p);                \
    Touch t[1] = {range(a->dstDevice, a->N * (elem))};    \
    return report(Access::Kind::kSet, t, 1, stream_expr); \
  }
  switch (cbid) {
    TRACK_COPY(cuMemcpy, cuMemcpy_params, a->dst, a->src, nullptr)
    TRACK_COPY(cuMemcpy_ptds, cuMemcpy_ptds_params, a->dst, a->src, CU_STREAM_PER_THREAD)
    TRACK_COPY(cuMemcpyAsync, cuMemcpyAsync_params, a->dst, a->src, a->hStream)
    TRACK_COPY(cuMemcpyAsync_ptsz, cuMemcpyAsync_ptsz_params, a->dst, a->src,
               per_thread(a->hStream))
    TRACK_COPY(cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_params, a->dstDevice, a->dstDevice, nullptr)
    TRACK_COPY(cuMemcpyHtoD_v2_ptds, cuMemcpyHtoD_v2_ptds_params, a->dstDevice, a->dstDevice,
               CU_STREAM_PER_THREAD)
    TRACK_COPY(cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_params, a->srcDevice, a->srcDevice, nullptr)
    TRACK_COPY(cuMemcpyDtoH_v2_ptds, cuMemcpyDtoH_v2_ptds_params, a->srcDevice, a->srcDevice,
               CU_STREAM_PER_THREAD)
    TRACK_COPY(cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_params, a->dstDevice, a->srcDevice, nullptr)
    TRACK_COPY(cuMemcpyDtoD_v2_ptds, cuMemcpyDtoD_v2_ptds_params, a->dstDevice, a->srcDevice,
               CU_STREAM_PER_THREAD)
    TRACK_COPY(cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_params, a->dstDevice, a->dstDevice,
               a->hStream)
    TRACK_COPY(cuMemcpyHtoDAsync_v2_ptsz, cuMemcpyHtoDAsync_v2_ptsz_params, a->dstDevice,
               a->dstDevice, per_thread(a->hStream))
    TRACK_COPY(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_params, a->srcDevice, a->srcDevice,
               a->hStream)
    TRACK_COPY(cuMemcpyDtoHAsync_v2_ptsz, cuMemcpyDtoHAsync_v2_ptsz_params, a->srcDevice,
               a->srcDevice, per_thread(a->hStream))
    TRACK_COPY(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_params, a->dstDevice, a->srcDevice,
               a->hStream)
    TRACK_COPY(cuMemcpyDtoDAsync_v2_ptsz, cuMemcpyDtoDAsync_v2_ptsz_params, a->dstDevice,
               a->srcDevice, per_thread(a->hStream))
    TRACK_SET(cuMemsetD8_v2, cuMemsetD8_v2_params, 1, nullptr)
    TRACK_SET(cuMemsetD8_v2_ptds, cuMemsetD8_v2_ptds_params, 1, CU_STREAM_PER_THREAD)
    TRACK_SET(cuMemsetD16_v2, cuMemsetD16_v2_params, 2, nullptr)
    TRACK_SET(cuMemsetD16_v2_ptds, cuMemsetD16_v2_ptds_params, 2, CU_STREAM_PER_THREAD)
    TRACK_SET(cuMemsetD32_v2, cuMemsetD32_v2_params, 4, nullptr)
    TRACK_SET(cuMemsetD32_v2_ptds, cuMemsetD32_v2_ptds_params, 4, CU_STREAM_PER_THREAD)
    TRACK_SET(cuMemsetD8Async, cuMemsetD8Async_params, 1, a->hStream)
    TRACK_SET(cuMemsetD8Async_ptsz, cuMemsetD8Async_ptsz_params, 1, per_thread(a->hStream))
    TRACK_SET(cuMemsetD16Async, cuMemsetD16Async_params, 2, a->hStream)
    TRACK_SET(cuMemsetD16Async_ptsz, cuMemsetD16Async_ptsz_params, 2, per_thread(a->hStream))
    TRACK_SET(cuMemsetD32Async, cuMemsetD32Async_params, 4, a->hStream)
    TRACK_SET(cuMemsetD32Async_ptsz, cuMemsetD32Async_ptsz_params, 4, per_thread(a->hStream))
    default:
      return;
  }
#undef TRACK_COPY
#undef TRACK_SET
}

const Tracker::Layout& Tracker::layout(CUfunction f) {
  std::lock_guard lk(layouts_mu_);
  auto& slot = layouts_[f];
  if (slot) return *slot;
  slot = std::make_unique<Layout>();
  const char* name = nullptr;
  if (d_.cuFuncGetName(&name, f) == CUDA_SUCCESS ||
      d_.cuKernelGetName(&name, reinterpret_cast<CUkernel>(f)) == CUDA_SUCCESS)
    slot->name = name;  // the driver keeps it while the module is loaded
  // cuda.h (cuFuncGetParamInfo): query until CUDA_ERROR_INVALID_VALUE. A
  // CUkernel passed as the CUfunction answers cuKernelGetParamInfo instead.
  bool kernel = false;
  for (size_t i = 0;; ++i) {
    size_t off = 0, size = 0;
    CUresult r = kernel ? d_.cuKernelGetParamInfo(reinterpret_cast<CUkernel>(f), i, &off, &size)
                        : d_.cuFuncGetParamInfo(f, i, &off, &size);
    if (r == CUDA_ERROR_INVALID_HANDLE && i == 0 && !kernel) {
      kernel = true;
      --i;
      continue;
    }
    if (r == CUDA_ERROR_INVALID_VALUE) {
      slot->known = true;
      break;
    }
    if (r != CUDA_SUCCESS) {
      log::warn(
          "cannot read the parameter layout of kernel {} ({}): its pointer arguments are "
          "not tracked",
          static_cast<void*>(f), cu::describe(d_, r));
      break;
    }
    slot->params.emplace_back(static_cast<uint32_t>(off), static_cast<uint32_t>(size));
  }
  return *slot;
}

void Tracker::on_unseen_runtime_launch(const CUpti_CallbackData* cb) {
  // A launch the runtime refused never reached the driver: nothing to see.
  const auto* rv = static_cast<const cudaError_t*>(cb->functionReturnValue);
  if (rv && *rv != cudaSuccess) return;
  if (unseen_runtime_launches_.fetch_add(1, std::memory_order_relaxed) == 0)
    log::warn(
        "a runtime launch ({}) reached no driver launch callback: such launches are not "
        "scanned, and an evicted block they use is read over the link (docs/limitations.md)",
        cb->functionName ? cb->functionName : "?");
}

void Tracker::scan_launch(CUfunction f, void** kernel_params, void** extra, CUstream stream) {
  launches_.fetch_add(1, std::memory_order_relaxed);
  ++t_launches_scanned;
  const Layout& l = layout(f);
  const Access access{Access::Kind::kLaunch, stream, l.name,
                      seq_.fetch_add(1, std::memory_order_relaxed) + 1, CurrentCall::correlation()};
  // All of a launch's touches go to the sink at once: its blocks are one
  // unit there (held together while any is restored). On the stack: the
  // launch path allocates nothing. A launch naming more than kMaxTouches
  // candidate pointers (PyTorch's multi-tensor kernels name about a hundred)
  // reports them in several calls.
  constexpr size_t kMaxTouches = 256;
  Touch found[kMaxTouches];
  size_t count = 0;
  auto flush = [&] {
    if (count == 0) return;
    touches_.fetch_add(count, std::memory_order_relaxed);
    deliver(access, found, count);
    count = 0;
  };
  uintptr_t lo = 0, hi = 0;
  sink_.envelope(&lo, &hi);
  const uintptr_t span = hi - lo;
  auto word = [&](const unsigned char* at) {
    uint64_t w;
    std::memcpy(&w, at, 8);
    // Most words are sizes, strides and flags: one inline compare rejects them.
    if (w - lo >= span || !sink_.may_own(w)) return;
    found[count++] = {w, w + 1};
    if (count == kMaxTouches) flush();
  };
  if (extra) {
    const unsigned char* buf = nullptr;
    size_t size = 0;
    for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
        buf = static_cast<const unsigned char*>(extra[i + 1]);
      else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
        size = *static_cast<const size_t*>(extra[i + 1]);
    }
    if (buf)
      for (size_t off = 0; off + 8 <= size; off += 8) word(buf + off);
  } else if (kernel_params) {
    // A pointer sits at an 8-byte-aligned offset of the packed arguments,
    // possibly inside a by-value struct.
    for (size_t i = 0; i < l.params.size(); ++i) {
      const auto [off, size] = l.params[i];
      const auto* arg = static_cast<const unsigned char*>(kernel_params[i]);
      for (uint32_t k = (8 - off % 8) % 8; k + 8 <= size; k += 8) word(arg + k);
    }
  }
  flush();
}

}  // namespace spillway
