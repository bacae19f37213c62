// Memory management entry points: VMM (reserve / create / map / access),
// classic device allocations and pinned host memory. See memory.h.
#include "api.h"
#include "graph.h"
#include "memory.h"

using namespace sim;

extern "C" {

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                     CUdeviceptr addr, unsigned long long flags) {
  cuMemAddressReserve_params p_{ptr, size, alignment, addr, flags};
  return SIM_INVOKE(cuMemAddressReserve, p_, [&] {
    SIM_NEED_CTX();
    return mem::address_reserve(ptr, size, alignment, addr, flags);
  });
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  cuMemAddressFree_params p_{ptr, size};
  return SIM_INVOKE(cuMemAddressFree, p_, [&] {
    SIM_NEED_CTX();
    return mem::address_free(ptr, size);
  });
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                             const CUmemAllocationProp* prop, unsigned long long flags) {
  cuMemCreate_params p_{handle, size, prop, flags};
  return SIM_INVOKE(cuMemCreate, p_, [&] {
    SIM_NEED_CTX();
    return mem::create(handle, size, prop, flags);
  });
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  cuMemRelease_params p_{handle};
  return SIM_INVOKE(cuMemRelease, p_, [&] {
    SIM_NEED_CTX();
    return mem::release(handle);
  });
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                          CUmemGenericAllocationHandle handle, unsigned long long flags) {
  cuMemMap_params p_{ptr, size, offset, handle, flags};
  return SIM_INVOKE(cuMemMap, p_, [&] {
    SIM_NEED_CTX();
    return mem::map(ptr, size, offset, handle, flags);
  });
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  cuMemUnmap_params p_{ptr, size};
  return SIM_INVOKE(cuMemUnmap, p_, [&] {
    SIM_NEED_CTX();
    return mem::unmap(ptr, size);
  });
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                size_t count) {
  cuMemSetAccess_params p_{ptr, size, desc, count};
  return SIM_INVOKE(cuMemSetAccess, p_, [&] {
    SIM_NEED_CTX();
    return mem::set_access(ptr, size, desc, count);
  });
}

CUresult CUDAAPI cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location,
                                CUdeviceptr ptr) {
  cuMemGetAccess_params p_{flags, location, ptr};
  return SIM_INVOKE(cuMemGetAccess, p_, [&] {
    SIM_NEED_CTX();
    return mem::get_access(flags, location, ptr);
  });
}

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                               CUmemAllocationGranularity_flags option) {
  cuMemGetAllocationGranularity_params p_{granularity, prop, option};
  return SIM_INVOKE(cuMemGetAllocationGranularity, p_, [&] {
    if (!state()) return CUDA_ERROR_NOT_INITIALIZED;
    return mem::granularity(granularity, prop, option);
  });
}

CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                        CUmemGenericAllocationHandle handle) {
  cuMemGetAllocationPropertiesFromHandle_params p_{prop, handle};
  return SIM_INVOKE(cuMemGetAllocationPropertiesFromHandle, p_, [&] {
    if (!state()) return CUDA_ERROR_NOT_INITIALIZED;
    return mem::properties_from_handle(prop, handle);
  });
}

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  cuMemAlloc_v2_params p_{dptr, bytesize};
  return SIM_INVOKE(cuMemAlloc_v2, p_, [&] {
    SIM_CTX(ctx);
    if (CUresult e = graph::check_unsafe("cuMemAlloc"); e != CUDA_SUCCESS) return e;
    return mem::mem_alloc(ctx->device, dptr, bytesize);
  });
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  cuMemFree_v2_params p_{dptr};
  return SIM_INVOKE(cuMemFree_v2, p_, [&] {
    SIM_NEED_CTX();
    if (CUresult e = graph::check_unsafe("cuMemFree"); e != CUDA_SUCCESS) return e;
    return mem::mem_free(dptr);
  });
}

CUresult CUDAAPI cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  cuMemHostAlloc_params p_{pp, bytesize, Flags};
  return SIM_INVOKE(cuMemHostAlloc, p_, [&] {
    SIM_NEED_CTX();
    return mem::host_alloc(pp, bytesize, Flags);
  });
}

CUresult CUDAAPI cuMemAllocHost_v2(void** pp, size_t bytesize) {
  cuMemAllocHost_v2_params p_{pp, bytesize};
  return SIM_INVOKE(cuMemAllocHost_v2, p_, [&] {
    SIM_NEED_CTX();
    return mem::host_alloc(pp, bytesize, 0);
  });
}

CUresult CUDAAPI cuMemFreeHost(void* p) {
  cuMemFreeHost_params p_{p};
  return SIM_INVOKE(cuMemFreeHost, p_, [&] {
    SIM_NEED_CTX();
    return mem::host_free(p);
  });
}

CUresult CUDAAPI cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int Flags) {
  cuMemHostRegister_v2_params p_{p, bytesize, Flags};
  return SIM_INVOKE(cuMemHostRegister_v2, p_, [&] {
    SIM_NEED_CTX();
    return mem::host_register(p, bytesize, Flags);
  });
}

CUresult CUDAAPI cuMemHostUnregister(void* p) {
  cuMemHostUnregister_params p_{p};
  return SIM_INVOKE(cuMemHostUnregister, p_, [&] {
    SIM_NEED_CTX();
    return mem::host_unregister(p);
  });
}

CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p, unsigned int Flags) {
  cuMemHostGetDevicePointer_v2_params p_{pdptr, p, Flags};
  return SIM_INVOKE(cuMemHostGetDevicePointer_v2, p_, [&] {
    SIM_NEED_CTX();
    if (!pdptr || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (!mem::is_pinned_host(reinterpret_cast<uintptr_t>(p), 1))
      return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemHostGetDevicePointer: %p is not pinned", p);
    // Unified addressing: the device sees pinned memory at its host address.
    *pdptr = reinterpret_cast<CUdeviceptr>(p);
    return CUDA_SUCCESS;
  });
}

}  // extern "C"
