// Device memory as real process memory. A VA reservation is an mmap(PROT_NONE)
// range; a physical allocation (cuMemCreate, device- or host-located) is a
// range of one sparse memfd; cuMemMap maps that range at the reservation with
// no access, and cuMemSetAccess opens it. So a simulated kernel or copy that
// touches an unmapped or inaccessible address faults for real, and the fault
// becomes CUDA_ERROR_ILLEGAL_ADDRESS (device_access.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda.h>

#include "state.h"

namespace sim::mem {

// VMM (cuda.h "Virtual Memory Management" section).
CUresult address_reserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                         unsigned long long flags);
CUresult address_free(CUdeviceptr ptr, size_t size);
CUresult create(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                unsigned long long flags);
CUresult release(CUmemGenericAllocationHandle handle);
CUresult map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
             unsigned long long flags);
CUresult unmap(CUdeviceptr ptr, size_t size);
CUresult set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count);
CUresult get_access(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr);
CUresult granularity(size_t* out, const CUmemAllocationProp* prop,
                     CUmemAllocationGranularity_flags option);
CUresult properties_from_handle(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle);

// Classic allocations.
CUresult mem_alloc(int device, CUdeviceptr* dptr, size_t size);
CUresult mem_free(CUdeviceptr dptr);
CUresult host_alloc(void** pp, size_t size, unsigned flags);
CUresult host_free(void* p);
CUresult host_register(void* p, size_t size, unsigned flags);
CUresult host_unregister(void* p);
CUresult get_info(int device, size_t* free_bytes, size_t* total_bytes);
CUresult set_external_usage(int device, uint64_t bytes);

// What backs an address, as seen by the copy engines and the clock.
enum class Where : uint8_t {
  kPageable,    // ordinary host memory
  kPinned,      // cuMemHostAlloc / cuMemHostRegister
  kDevice,      // device VA mapped to device-located physical memory
  kHostMapped,  // device VA mapped to host-located physical memory
  kUnmapped,    // device VA (inside a reservation) with no mapping
};
struct Located {
  Where where;
  int device;     // for device VA: the device of the physical memory (or reservation)
  Range mapping;  // for mapped device VA: the whole mapping containing the address
};
Located locate(uintptr_t p);
bool is_device_va(uintptr_t p);
bool is_pinned_host(uintptr_t p, size_t n);

struct Stats {
  uint64_t device_capacity, device_used, device_peak;
  uint64_t host_capacity, host_used, host_peak;
};
Stats stats(int device);

// Called once from init_state.
void init(const Config& cfg);

}  // namespace sim::mem
