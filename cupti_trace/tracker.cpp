#include "tracker.h"

#include <cstring>

#include "log.h"

namespace spillway {
namespace {

// Driver calls made while handling a callback (cuFuncGetParamInfo, a
// restore's cuMemMap...) fire callbacks too: ignore those.
thread_local bool t_in_callback = false;

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

// A _ptsz/_ptds call with a NULL stream means the thread's default stream.
CUstream per_thread(CUstream s) {
  return s ? s : CU_STREAM_PER_THREAD;
}

struct Scope {
  Scope() { t_in_callback = true; }
  ~Scope() { t_in_callback = false; }
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
  if (!ok) return nullptr;  // the destructor unsubscribes
  return t;
}

Tracker::~Tracker() {
  if (subscriber_) api_.cuptiUnsubscribe(subscriber_);
}

void CUPTIAPI Tracker::callback(void* self, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                const void* data) {
  if (t_in_callback || InternalCalls::active() || domain != CUPTI_CB_DOMAIN_DRIVER_API) return;
  const auto* cb = static_cast<const CUpti_CallbackData*>(data);
  // Before the call: the work is not queued yet, so a restore is in time.
  if (cb->callbackSite != CUPTI_API_ENTER) return;
  Scope scope;
  static_cast<Tracker*>(self)->on_driver_call(cbid, cb->functionParams);
}

void Tracker::report(Access::Kind kind, const Touch* t, size_t n, CUstream stream) {
  const uint64_t seq = seq_.fetch_add(1, std::memory_order_relaxed) + 1;
  size_t mine = 0;
  Touch kept[2];  // a copy has two sides, a set one
  for (size_t i = 0; i < n && i < 2; ++i)
    if (sink_.may_own(t[i].lo) || sink_.may_own(t[i].hi - 1)) kept[mine++] = t[i];
  if (mine == 0) return;
  touches_.fetch_add(mine, std::memory_order_relaxed);
  sink_.before_use(Access{kind, stream, nullptr, seq}, kept, mine);
}

void Tracker::on_driver_call(CUpti_CallbackId cbid, const void* p) {
  auto range = [](CUdeviceptr a, size_t n) { return Touch{a, a + (n ? n : 1)}; };
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

void Tracker::scan_launch(CUfunction f, void** kernel_params, void** extra, CUstream stream) {
  launches_.fetch_add(1, std::memory_order_relaxed);
  const Layout& l = layout(f);
  const Access access{Access::Kind::kLaunch, stream, l.name,
                      seq_.fetch_add(1, std::memory_order_relaxed) + 1};
  // On the launch path: no heap allocation. Touches are reported in batches
  // of a fixed size (a kernel with more pointer arguments just reports twice).
  constexpr size_t kBatch = 32;
  Touch found[kBatch];
  size_t count = 0;
  auto flush = [&] {
    if (count == 0) return;
    touches_.fetch_add(count, std::memory_order_relaxed);
    sink_.before_use(access, found, count);
    count = 0;
  };
  auto word = [&](const unsigned char* at) {
    uint64_t w;
    std::memcpy(&w, at, 8);
    if (!sink_.may_own(w)) return;
    found[count++] = {w, w + 1};
    if (count == kBatch) flush();
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
