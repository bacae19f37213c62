// Copies and memsets. Each becomes one op on a copy engine (or the compute
// engine for device-to-device work) that moves real bytes on the worker thread.
//
// Modeled from the CUDA runtime/driver docs, "API synchronization behavior":
//  - an "Async" copy that involves pageable host memory is synchronous: the
//    host waits for it (stricter than hardware, which may return once the
//    source is staged);
//  - the non-Async copies and memsets are synchronous and run on the default
//    stream (legacy, or per-thread for the _ptds variants).
#include <cupti_activity.h>

#include <cstring>

#include "api.h"
#include "graph.h"
#include "variants.h"
#include "memory.h"

using namespace sim;

namespace {

enum class Expect { kAny, kHtoD, kDtoH, kDtoD };

bool device_side(mem::Where w) {
  return w == mem::Where::kDevice || w == mem::Where::kUnmapped;
}
bool device_va(mem::Where w) {
  return w != mem::Where::kPageable && w != mem::Where::kPinned;
}

uint8_t memory_kind(mem::Where w) {
  switch (w) {
    case mem::Where::kPageable:
      return CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE;
    case mem::Where::kPinned:
    case mem::Where::kHostMapped:
      return CUPTI_ACTIVITY_MEMORY_KIND_PINNED;
    default:
      return CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
  }
}

mem::Where where_of(uintptr_t p, size_t n) {
  const mem::Located at = mem::locate(p);
  // Managed memory: the copy goes where the data is. A range with any granule
  // on a device is device memory for the engine (the costlier choice for a
  // range split between device and host); copies do not migrate it.
  if (at.managed)
    return mem::managed_on_device(p, n) ? mem::Where::kDevice : mem::Where::kHostMapped;
  mem::Where w = at.where;
  // Partly pinned host memory is pageable for the copy engine.
  if (w == mem::Where::kPinned && !mem::is_pinned_host(p, n)) return mem::Where::kPageable;
  return w;
}

// SIMCUDA_DATA=0: a copy or memset moves nothing, but still reads its first
// and last byte at each end, so a range unmapped under queued work faults as
// it would with data (device_access catches it). Reads only: a memfd hole
// costs one page, not the range.
void probe_ends(uintptr_t p, size_t n) {
  const volatile char* c = reinterpret_cast<const volatile char*>(p);
  (void)c[0];
  (void)c[n - 1];
}

// `handle` is the user's stream; `sync` marks the non-Async APIs.
CUresult copy(const char* api, uintptr_t dst, uintptr_t src, size_t n, CUstream handle,
              Expect expect, bool sync) {
  SIM_CTX(ctx);
  std::shared_ptr<Stream> s;
  if (CUresult e = stream::resolve(ctx, handle, &s); e != CUDA_SUCCESS) return e;
  if (n == 0) return CUDA_SUCCESS;
  if (!dst || !src) return refuse(CUDA_ERROR_INVALID_VALUE, "%s: null pointer", api);
  const mem::Where ws = where_of(src, n), wd = where_of(dst, n);
  bool ok = true;
  switch (expect) {
    case Expect::kHtoD:
      ok = !device_va(ws) && device_va(wd);
      break;
    case Expect::kDtoH:
      ok = device_va(ws) && !device_va(wd);
      break;
    case Expect::kDtoD:
      ok = device_va(ws) && device_va(wd);
      break;
    case Expect::kAny:
      break;
  }
  if (!ok)
    return refuse(CUDA_ERROR_INVALID_VALUE,
                  "%s: source %#lx or destination %#lx is on the wrong side for this copy", api,
                  static_cast<unsigned long>(src), static_cast<unsigned long>(dst));

  const bool pageable = ws == mem::Where::kPageable || wd == mem::Where::kPageable;
  // The engine and direction follow where the memory is when the op is
  // enqueued (a captured copy replayed after an eviction crosses the link).
  const std::string what = std::string(api) + " of " + std::to_string(n) + " bytes";
  const bool managed_src = mem::locate(src).managed, managed_dst = mem::locate(dst).managed;
  graph::Emit emit = [dst, src, n, what, managed_src, managed_dst](
                         const std::shared_ptr<Stream>& st, CUstream) -> std::shared_ptr<Op> {
    const mem::Where ws = where_of(src, n), wd = where_of(dst, n);
    const bool from_dev = device_side(ws), to_dev = device_side(wd);
    Engine engine = Engine::kCopyH2D;
    uint8_t kind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOH;
    if (from_dev && to_dev) {
      engine = Engine::kCompute;
      kind = CUPTI_ACTIVITY_MEMCPY_KIND_DTOD;
    } else if (from_dev) {
      engine = Engine::kCopyD2H;
      kind = CUPTI_ACTIVITY_MEMCPY_KIND_DTOH;
    } else if (to_dev) {
      kind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
    }
    auto op = std::make_shared<Op>();
    op->kind = Op::Kind::kCopy;
    op->engine = engine;
    op->what = what;
    if (state()->config.move_data)
      op->effect = [dst, src, n] {
        std::memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
      };
    else
      op->effect = [dst, src, n] { probe_ends(src, n), probe_ends(dst, n); };
    if (device_va(ws)) op->touched.push_back({src, src + n});
    if (device_va(wd)) op->touched.push_back({dst, dst + n});
    op->report_activity = true;
    op->activity.kind = simbridge::Activity::Kind::kMemcpy;
    op->activity.correlation_id = api::current_correlation();
    op->activity.bytes = n;
    op->activity.copy_kind = kind;
    op->activity.src_kind =
        managed_src ? uint8_t{CUPTI_ACTIVITY_MEMORY_KIND_MANAGED} : memory_kind(ws);
    op->activity.dst_kind =
        managed_dst ? uint8_t{CUPTI_ACTIVITY_MEMORY_KIND_MANAGED} : memory_kind(wd);
    const Config& cfg = state()->config;
    stream::enqueue(st, op, [&](Device& dev, uint64_t earliest) {
      return clock::schedule_copy(dev, engine, earliest, n, cfg);
    });
    Device& dev = *state()->devices[static_cast<size_t>(st->ctx->device)];
    if (engine == Engine::kCopyH2D && to_dev) dev.bytes_h2d += n;
    if (engine == Engine::kCopyD2H) dev.bytes_d2h += n;
    return op;
  };
  // A copy the host waits for (synchronous, or pageable: see above) cannot be
  // captured; synchronous copies are also "potentially unsafe" calls.
  bool captured = false;
  if (CUresult e = graph::intercept(s, api, sync || pageable, emit, &captured); captured) return e;
  if (sync)
    if (CUresult e = graph::check_unsafe(api); e != CUDA_SUCCESS) return e;
  auto op = emit(s, handle);
  if (sync || pageable) stream::wait(op);
  return ctx->sticky.load();
}

template <class T>
CUresult memset(const char* api, CUdeviceptr dst, T value, size_t count, CUstream handle,
                bool sync) {
  SIM_CTX(ctx);
  std::shared_ptr<Stream> s;
  if (CUresult e = stream::resolve(ctx, handle, &s); e != CUDA_SUCCESS) return e;
  if (count == 0) return CUDA_SUCCESS;
  // cuda.h (cuMemsetD16/D32): the pointer must be 2- / 4-byte aligned.
  if (dst % sizeof(T) != 0)
    return refuse(CUDA_ERROR_INVALID_VALUE, "%s: %#llx is not %zu-byte aligned", api, dst,
                  sizeof(T));
  mem::Where w = mem::locate(dst).where;
  if (!device_va(w))
    return refuse(CUDA_ERROR_INVALID_VALUE, "%s: %#llx is not device memory", api, dst);
  const size_t bytes = count * sizeof(T);
  const std::string what = std::string(api) + " of " + std::to_string(bytes) + " bytes";
  graph::Emit emit = [dst, value, count, bytes, what](const std::shared_ptr<Stream>& st,
                                                      CUstream) -> std::shared_ptr<Op> {
    const mem::Where w = where_of(dst, bytes);
    auto op = std::make_shared<Op>();
    op->kind = Op::Kind::kMemset;
    op->what = what;
    if (state()->config.move_data)
      op->effect = [dst, value, count] {
        T* p = reinterpret_cast<T*>(dst);
        for (size_t i = 0; i < count; ++i) p[i] = value;
      };
    else
      op->effect = [dst, bytes] { probe_ends(dst, bytes); };
    op->touched.push_back({dst, dst + bytes});
    op->report_activity = true;
    op->activity.kind = simbridge::Activity::Kind::kMemset;
    op->activity.correlation_id = api::current_correlation();
    op->activity.bytes = bytes;
    op->activity.value = static_cast<uint32_t>(value);
    op->activity.dst_kind = memory_kind(w);
    const Config& cfg = state()->config;
    // Writing host-located memory crosses the link; device memory costs HBM time.
    const bool remote = w == mem::Where::kHostMapped;
    stream::enqueue(st, op, [&](Device& dev, uint64_t earliest) {
      if (remote) return clock::schedule_copy(dev, Engine::kCopyH2D, earliest, bytes, cfg);
      double ns = static_cast<double>(bytes) / cfg.hbm_bytes_per_ns;
      return clock::schedule_fixed(dev, Engine::kCompute, earliest, static_cast<uint64_t>(ns) + 1);
    });
    return op;
  };
  bool captured = false;
  if (CUresult e = graph::intercept(s, api, sync, emit, &captured); captured) return e;
  if (sync)
    if (CUresult e = graph::check_unsafe(api); e != CUDA_SUCCESS) return e;
  auto op = emit(s, handle);
  if (sync) stream::wait(op);
  return ctx->sticky.load();
}

uintptr_t U(CUdeviceptr p) {
  return static_cast<uintptr_t>(p);
}
uintptr_t U(const void* p) {
  return reinterpret_cast<uintptr_t>(p);
}

// _ptsz / _ptds: a NULL stream means the calling thread's default stream.
CUstream per_thread(CUstream s) {
  return s ? s : CU_STREAM_PER_THREAD;
}

}  // namespace

extern "C" {

// ---- generic (unified addressing) ----
CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  cuMemcpy_params p_{dst, src, n};
  return SIM_INVOKE(cuMemcpy, p_,
                    [&] { return copy("cuMemcpy", dst, src, n, nullptr, Expect::kAny, true); });
}
CUresult CUDAAPI cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  cuMemcpy_ptds_params p_{dst, src, n};
  return SIM_INVOKE(cuMemcpy_ptds, p_, [&] {
    return copy("cuMemcpy", dst, src, n, CU_STREAM_PER_THREAD, Expect::kAny, true);
  });
}
CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  cuMemcpyAsync_params p_{dst, src, n, s};
  return SIM_INVOKE(cuMemcpyAsync, p_,
                    [&] { return copy("cuMemcpyAsync", dst, src, n, s, Expect::kAny, false); });
}
CUresult CUDAAPI cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  cuMemcpyAsync_ptsz_params p_{dst, src, n, s};
  return SIM_INVOKE(cuMemcpyAsync_ptsz, p_, [&] {
    return copy("cuMemcpyAsync", dst, src, n, per_thread(s), Expect::kAny, false);
  });
}

// ---- synchronous, explicit direction ----
CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  cuMemcpyHtoD_v2_params p_{dst, src, n};
  return SIM_INVOKE(cuMemcpyHtoD_v2, p_, [&] {
    return copy("cuMemcpyHtoD", U(dst), U(src), n, nullptr, Expect::kHtoD, true);
  });
}
CUresult CUDAAPI cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void* src, size_t n) {
  cuMemcpyHtoD_v2_ptds_params p_{dst, src, n};
  return SIM_INVOKE(cuMemcpyHtoD_v2_ptds, p_, [&] {
    return copy("cuMemcpyHtoD", U(dst), U(src), n, CU_STREAM_PER_THREAD, Expect::kHtoD, true);
  });
}
CUresult CUDAAPI cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  cuMemcpyDtoH_v2_params p_{dst, src, n};
  return SIM_INVOKE(cuMemcpyDtoH_v2, p_, [&] {
    return copy("cuMemcpyDtoH", U(dst), U(src), n, nullptr, Expect::kDtoH, true);
  });
}
CUresult CUDAAPI cuMemcpyDtoH_v2_ptds(void* dst, CUdeviceptr src, size_t n) {
  cuMemcpyDtoH_v2_ptds_params p_{dst, src, n};
  return SIM_INVOKE(cuMemcpyDtoH_v2_ptds, p_, [&] {
    return copy("cuMemcpyDtoH", U(dst), U(src), n, CU_STREAM_PER_THREAD, Expect::kDtoH, true);
  });
}
CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  cuMemcpyDtoD_v2_params p_{dst, src, n};
  return SIM_INVOKE(cuMemcpyDtoD_v2, p_, [&] {
    return copy("cuMemcpyDtoD", U(dst), U(src), n, nullptr, Expect::kDtoD, true);
  });
}
CUresult CUDAAPI cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  cuMemcpyDtoD_v2_ptds_params p_{dst, src, n};
  return SIM_INVOKE(cuMemcpyDtoD_v2_ptds, p_, [&] {
    return copy("cuMemcpyDtoD", U(dst), U(src), n, CU_STREAM_PER_THREAD, Expect::kDtoD, true);
  });
}

// ---- asynchronous, explicit direction ----
CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
  cuMemcpyHtoDAsync_v2_params p_{dst, src, n, s};
  return SIM_INVOKE(cuMemcpyHtoDAsync_v2, p_, [&] {
    return copy("cuMemcpyHtoDAsync", U(dst), U(src), n, s, Expect::kHtoD, false);
  });
}
CUresult CUDAAPI cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
  cuMemcpyHtoDAsync_v2_ptsz_params p_{dst, src, n, s};
  return SIM_INVOKE(cuMemcpyHtoDAsync_v2_ptsz, p_, [&] {
    return copy("cuMemcpyHtoDAsync", U(dst), U(src), n, per_thread(s), Expect::kHtoD, false);
  });
}
CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream s) {
  cuMemcpyDtoHAsync_v2_params p_{dst, src, n, s};
  return SIM_INVOKE(cuMemcpyDtoHAsync_v2, p_, [&] {
    return copy("cuMemcpyDtoHAsync", U(dst), U(src), n, s, Expect::kDtoH, false);
  });
}
CUresult CUDAAPI cuMemcpyDtoHAsync_v2_ptsz(void* dst, CUdeviceptr src, size_t n, CUstream s) {
  cuMemcpyDtoHAsync_v2_ptsz_params p_{dst, src, n, s};
  return SIM_INVOKE(cuMemcpyDtoHAsync_v2_ptsz, p_, [&] {
    return copy("cuMemcpyDtoHAsync", U(dst), U(src), n, per_thread(s), Expect::kDtoH, false);
  });
}
CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  cuMemcpyDtoDAsync_v2_params p_{dst, src, n, s};
  return SIM_INVOKE(cuMemcpyDtoDAsync_v2, p_, [&] {
    return copy("cuMemcpyDtoDAsync", U(dst), U(src), n, s, Expect::kDtoD, false);
  });
}
CUresult CUDAAPI cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  cuMemcpyDtoDAsync_v2_ptsz_params p_{dst, src, n, s};
  return SIM_INVOKE(cuMemcpyDtoDAsync_v2_ptsz, p_, [&] {
    return copy("cuMemcpyDtoDAsync", U(dst), U(src), n, per_thread(s), Expect::kDtoD, false);
  });
}

// ---- memsets ----
CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
  cuMemsetD8_v2_params p_{dst, v, n};
  return SIM_INVOKE(cuMemsetD8_v2, p_,
                    [&] { return memset("cuMemsetD8", dst, v, n, nullptr, true); });
}
CUresult CUDAAPI cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char v, size_t n) {
  cuMemsetD8_v2_ptds_params p_{dst, v, n};
  return SIM_INVOKE(cuMemsetD8_v2_ptds, p_,
                    [&] { return memset("cuMemsetD8", dst, v, n, CU_STREAM_PER_THREAD, true); });
}
CUresult CUDAAPI cuMemsetD16_v2(CUdeviceptr dst, unsigned short v, size_t n) {
  cuMemsetD16_v2_params p_{dst, v, n};
  return SIM_INVOKE(cuMemsetD16_v2, p_,
                    [&] { return memset("cuMemsetD16", dst, v, n, nullptr, true); });
}
CUresult CUDAAPI cuMemsetD16_v2_ptds(CUdeviceptr dst, unsigned short v, size_t n) {
  cuMemsetD16_v2_ptds_params p_{dst, v, n};
  return SIM_INVOKE(cuMemsetD16_v2_ptds, p_,
                    [&] { return memset("cuMemsetD16", dst, v, n, CU_STREAM_PER_THREAD, true); });
}
CUresult CUDAAPI cuMemsetD32_v2(CUdeviceptr dst, unsigned int v, size_t n) {
  cuMemsetD32_v2_params p_{dst, v, n};
  return SIM_INVOKE(cuMemsetD32_v2, p_,
                    [&] { return memset("cuMemsetD32", dst, v, n, nullptr, true); });
}
CUresult CUDAAPI cuMemsetD32_v2_ptds(CUdeviceptr dst, unsigned int v, size_t n) {
  cuMemsetD32_v2_ptds_params p_{dst, v, n};
  return SIM_INVOKE(cuMemsetD32_v2_ptds, p_,
                    [&] { return memset("cuMemsetD32", dst, v, n, CU_STREAM_PER_THREAD, true); });
}
CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) {
  cuMemsetD8Async_params p_{dst, v, n, s};
  return SIM_INVOKE(cuMemsetD8Async, p_,
                    [&] { return memset("cuMemsetD8Async", dst, v, n, s, false); });
}
CUresult CUDAAPI cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) {
  cuMemsetD8Async_ptsz_params p_{dst, v, n, s};
  return SIM_INVOKE(cuMemsetD8Async_ptsz, p_,
                    [&] { return memset("cuMemsetD8Async", dst, v, n, per_thread(s), false); });
}
CUresult CUDAAPI cuMemsetD16Async(CUdeviceptr dst, unsigned short v, size_t n, CUstream s) {
  cuMemsetD16Async_params p_{dst, v, n, s};
  return SIM_INVOKE(cuMemsetD16Async, p_,
                    [&] { return memset("cuMemsetD16Async", dst, v, n, s, false); });
}
CUresult CUDAAPI cuMemsetD16Async_ptsz(CUdeviceptr dst, unsigned short v, size_t n, CUstream s) {
  cuMemsetD16Async_ptsz_params p_{dst, v, n, s};
  return SIM_INVOKE(cuMemsetD16Async_ptsz, p_,
                    [&] { return memset("cuMemsetD16Async", dst, v, n, per_thread(s), false); });
}
CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream s) {
  cuMemsetD32Async_params p_{dst, v, n, s};
  return SIM_INVOKE(cuMemsetD32Async, p_,
                    [&] { return memset("cuMemsetD32Async", dst, v, n, s, false); });
}
CUresult CUDAAPI cuMemsetD32Async_ptsz(CUdeviceptr dst, unsigned int v, size_t n, CUstream s) {
  cuMemsetD32Async_ptsz_params p_{dst, v, n, s};
  return SIM_INVOKE(cuMemsetD32Async_ptsz, p_,
                    [&] { return memset("cuMemsetD32Async", dst, v, n, per_thread(s), false); });
}

}  // extern "C"
