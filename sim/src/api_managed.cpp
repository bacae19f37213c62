// Managed (unified) memory entry points: allocation, prefetch, advice and the
// attribute queries. The residency model is in memory.cpp (managed_*); the
// kernel side (fault-driven migration) is in api_launch.cpp.
//
// Only the CUDA 13 forms exist: cuda.h declares cuMemPrefetchAsync(CUdevice)
// and cuMemAdvise(CUdevice) only under __CUDA_API_VERSION_INTERNAL, and maps
// the public names to cuMemPrefetchAsync_v2 / cuMemAdvise_v2.
#include "api.h"
#include "graph.h"
#include "memory.h"
#include "variants.h"

using namespace sim;

namespace {

// A destination or advice location naming a device must name a real one
// that has CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS (cuda.h,
// cuMemPrefetchAsync and cuMemAdvise); CUDA_ERROR_INVALID_DEVICE otherwise,
// the device error both calls list.
CUresult check_device(const char* api, int id) {
  const Config& cfg = state()->config;
  if (id < 0 || id >= cfg.device_count)
    return refuse(CUDA_ERROR_INVALID_DEVICE, "%s: no device %d", api, id);
  if (!cfg.concurrent_managed)
    return refuse(CUDA_ERROR_INVALID_DEVICE,
                  "%s: device %d has CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS = 0 "
                  "(SIMCUDA_CONCURRENT_MANAGED=0)",
                  api, id);
  return CUDA_SUCCESS;
}

// HOST (id ignored), HOST_NUMA (the simulated host has one node, id 0, as
// CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID reports) or HOST_NUMA_CURRENT (id ignored).
CUresult check_host(const char* api, const CUmemLocation& l) {
  if (l.type == CU_MEM_LOCATION_TYPE_HOST_NUMA && l.id != 0)
    return refuse(CUDA_ERROR_INVALID_VALUE, "%s: no host NUMA node %d", api, l.id);
  return CUDA_SUCCESS;
}

CUresult check_range(const char* api, CUdeviceptr ptr, size_t count) {
  // cuda.h: "The memory range must refer to managed memory allocated via
  // cuMemAllocManaged". A range running past its allocation is refused too
  // (stricter: hardware may accept adjacent managed allocations).
  if (count == 0 || !mem::is_managed_range(static_cast<uintptr_t>(ptr), count))
    return refuse(CUDA_ERROR_INVALID_VALUE,
                  "%s: [%#llx, +%zu) is not inside one cuMemAllocManaged allocation", api, ptr,
                  count);
  return CUDA_SUCCESS;
}

CUresult prefetch(const char* api, CUdeviceptr ptr, size_t count, CUmemLocation location,
                  unsigned flags, CUstream handle) {
  SIM_CTX(ctx);
  std::shared_ptr<Stream> s;
  if (CUresult e = stream::resolve(ctx, handle, &s); e != CUDA_SUCCESS) return e;
  // cuda.h: "flags - flags for future use, must be zero now."
  if (flags != 0) return refuse(CUDA_ERROR_INVALID_VALUE, "%s: flags must be zero", api);
  switch (location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      if (CUresult e = check_device(api, location.id); e != CUDA_SUCCESS) return e;
      // cuda.h: "hStream must be associated with a device that has a non-zero
      // value for ... CONCURRENT_MANAGED_ACCESS" (all simulated devices share
      // the setting, so check_device covered it).
      break;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
      if (CUresult e = check_host(api, location); e != CUDA_SUCCESS) return e;
      break;
    default:
      return refuse(CUDA_ERROR_INVALID_VALUE, "%s: location type %d is not a prefetch target", api,
                    static_cast<int>(location.type));
  }
  if (CUresult e = check_range(api, ptr, count); e != CUDA_SUCCESS) return e;

  const uintptr_t lo = static_cast<uintptr_t>(ptr);
  const std::string what = std::string(api) + " of " + std::to_string(count) + " bytes";
  graph::Emit emit = [lo, count, location, what](const std::shared_ptr<Stream>& st,
                                                 CUstream) -> std::shared_ptr<Op> {
    auto op = std::make_shared<Op>();
    op->kind = Op::Kind::kCopy;
    op->what = what;
    // No effect: the bytes are at the same address wherever they "live", so
    // nothing is read or written (SIMCUDA_DATA=0 or not). The range is
    // touched so that cuMemFree waits for the prefetch.
    op->touched.push_back({lo, lo + count});
    // Real CUPTI reports unified-memory counters for migrations, not memcpy
    // records: no activity record.
    const mem::Migration mig = mem::managed_prefetch(lo, count, location);
    op->engine = mig.to_device ? Engine::kCopyH2D : mig.to_host ? Engine::kCopyD2H : Engine::kNone;
    const Config& cfg = state()->config;
    stream::enqueue(st, op, [&](Device& dev, uint64_t earliest) {
      // Evictions (device to host) and the migration itself each occupy
      // their direction's copy engine from the op's start; the op ends when
      // both are done.
      clock::Interval iv{earliest, earliest};
      bool first = true;
      auto add = [&](Engine e, uint64_t bytes) {
        if (!bytes) return;
        clock::Interval x = clock::schedule_copy(dev, e, earliest, bytes, cfg);
        iv.start = first ? x.start : std::min(iv.start, x.start);
        iv.end = std::max(iv.end, x.end);
        first = false;
      };
      add(Engine::kCopyD2H, mig.to_host);
      add(Engine::kCopyH2D, mig.to_device);
      return iv;
    });
    Device& dev = *state()->devices[static_cast<size_t>(st->ctx->device)];
    dev.bytes_h2d += mig.to_device;
    dev.bytes_d2h += mig.to_host;
    return op;
  };
  bool captured = false;
  if (CUresult e = graph::intercept(s, api, false, emit, &captured); captured) return e;
  emit(s, handle);
  return ctx->sticky.load();
}

CUresult advise(CUdeviceptr ptr, size_t count, CUmem_advise advice, CUmemLocation location) {
  constexpr const char* api = "cuMemAdvise";
  SIM_NEED_CTX();
  switch (advice) {
    case CU_MEM_ADVISE_SET_READ_MOSTLY:
    case CU_MEM_ADVISE_UNSET_READ_MOSTLY:
    case CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION:
      break;  // cuda.h: "The location argument is ignored for this advice."
    case CU_MEM_ADVISE_SET_PREFERRED_LOCATION:
      if (location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        if (CUresult e = check_device(api, location.id); e != CUDA_SUCCESS) return e;
      } else if (location.type == CU_MEM_LOCATION_TYPE_HOST ||
                 location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
                 location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT) {
        if (CUresult e = check_host(api, location); e != CUDA_SUCCESS) return e;
      } else {
        return refuse(CUDA_ERROR_INVALID_VALUE, "%s: bad preferred location type %d", api,
                      static_cast<int>(location.type));
      }
      break;
    case CU_MEM_ADVISE_SET_ACCESSED_BY:
    case CU_MEM_ADVISE_UNSET_ACCESSED_BY:
      // cuda.h: "The CUmemLocation::type must be either
      // CU_MEM_LOCATION_TYPE_DEVICE with CUmemLocation::id representing a
      // valid device ordinal or CU_MEM_LOCATION_TYPE_HOST ... All other
      // location types are invalid." (The sim applies this to UNSET too.)
      if (location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        if (CUresult e = check_device(api, location.id); e != CUDA_SUCCESS) return e;
      } else if (location.type != CU_MEM_LOCATION_TYPE_HOST) {
        return refuse(CUDA_ERROR_INVALID_VALUE, "%s: ACCESSED_BY needs a DEVICE or HOST location",
                      api);
      }
      break;
    default:
      return refuse(CUDA_ERROR_INVALID_VALUE, "%s: unknown advice %d", api,
                    static_cast<int>(advice));
  }
  // System-allocated pageable memory is allowed only with
  // CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, which the sim reports as 0.
  if (CUresult e = check_range(api, ptr, count); e != CUDA_SUCCESS) return e;
  mem::managed_advise(static_cast<uintptr_t>(ptr), count, advice, location);
  return CUDA_SUCCESS;
}

CUstream per_thread(CUstream s) {
  return s ? s : CU_STREAM_PER_THREAD;
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  cuMemAllocManaged_params p_{dptr, bytesize, flags};
  return SIM_INVOKE(cuMemAllocManaged, p_, [&] {
    SIM_CTX(ctx);
    // An allocation, "potentially unsafe" during capture like cuMemAlloc.
    if (CUresult e = graph::check_unsafe("cuMemAllocManaged"); e != CUDA_SUCCESS) return e;
    return mem::managed_alloc(ctx->device, dptr, bytesize, flags);
  });
}

CUresult CUDAAPI cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count, CUmemLocation location,
                                       unsigned int flags, CUstream hStream) {
  cuMemPrefetchAsync_v2_params p_{devPtr, count, location, flags, hStream};
  return SIM_INVOKE(cuMemPrefetchAsync_v2, p_, [&] {
    return prefetch("cuMemPrefetchAsync", devPtr, count, location, flags, hStream);
  });
}

CUresult CUDAAPI cuMemPrefetchAsync_v2_ptsz(CUdeviceptr devPtr, size_t count,
                                            CUmemLocation location, unsigned int flags,
                                            CUstream hStream) {
  cuMemPrefetchAsync_v2_ptsz_params p_{devPtr, count, location, flags, hStream};
  return SIM_INVOKE(cuMemPrefetchAsync_v2_ptsz, p_, [&] {
    return prefetch("cuMemPrefetchAsync", devPtr, count, location, flags, per_thread(hStream));
  });
}

CUresult CUDAAPI cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                                CUmemLocation location) {
  cuMemAdvise_v2_params p_{devPtr, count, advice, location};
  return SIM_INVOKE(cuMemAdvise_v2, p_, [&] { return advise(devPtr, count, advice, location); });
}

CUresult CUDAAPI cuMemRangeGetAttribute(void* data, size_t dataSize,
                                        CUmem_range_attribute attribute, CUdeviceptr devPtr,
                                        size_t count) {
  cuMemRangeGetAttribute_params p_{data, dataSize, attribute, devPtr, count};
  return SIM_INVOKE(cuMemRangeGetAttribute, p_, [&] {
    SIM_NEED_CTX();
    return mem::managed_range_attribute(data, dataSize, attribute, static_cast<uintptr_t>(devPtr),
                                        count);
  });
}

CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  cuPointerGetAttribute_params p_{data, attribute, ptr};
  return SIM_INVOKE(cuPointerGetAttribute, p_, [&] {
    SIM_NEED_CTX();
    if (!data) return refuse(CUDA_ERROR_INVALID_VALUE, "cuPointerGetAttribute: null data");
    // Only the attribute managed memory needs; the others are refused rather
    // than invented (as cuDeviceGetAttribute does for attributes it lacks).
    if (attribute != CU_POINTER_ATTRIBUTE_IS_MANAGED)
      return refuse(CUDA_ERROR_INVALID_VALUE,
                    "cuPointerGetAttribute: attribute %d is not simulated (only IS_MANAGED)",
                    static_cast<int>(attribute));
    const mem::Located at = mem::locate(static_cast<uintptr_t>(ptr));
    // cuda.h (IS_MANAGED): "If ptr is not a valid CUDA pointer then
    // CUDA_ERROR_INVALID_VALUE is returned."
    if (at.where == mem::Where::kPageable)
      return refuse(CUDA_ERROR_INVALID_VALUE, "cuPointerGetAttribute: %#llx is not a CUDA pointer",
                    ptr);
    const unsigned int managed = at.managed ? 1 : 0;  // cuda.h: "a boolean"
    std::memcpy(data, &managed, sizeof managed);
    return CUDA_SUCCESS;
  });
}

}  // extern "C"
