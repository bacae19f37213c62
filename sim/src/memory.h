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
#include <vector>

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
// cuMemUnmap also moves the caller's clock to the end of the latest op that
// used the mappings (note_completed_use) and stamps each physical
// allocation with the caller's clock after that; cuMemMap moves the caller's
// clock to the allocation's stamp. On hardware one timeline orders the
// threads that hand memory over; here each thread has its own clock, so the
// handover is made explicit at the memory (docs/sim.md).
CUresult unmap(CUdeviceptr ptr, size_t size);
CUresult set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count);
CUresult get_access(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr);
CUresult granularity(size_t* out, const CUmemAllocationProp* prop,
                     CUmemAllocationGranularity_flags option);
CUresult properties_from_handle(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle);

// A stream worker, when an op that touched `touched` has really completed
// (before it leaves the pending list, so cuMemUnmap sees either the op
// pending or its end noted): the mappings in those ranges remember `vend`.
void note_completed_use(const std::vector<Range>& touched, uint64_t vend);

// A value that changes whenever a mapping overlapping [lo, hi) is made,
// removed, or has its access changed (simcuda.h), read under the lock that
// orders those changes.
uint64_t mapping_signature(uintptr_t lo, uintptr_t hi);

// Classic allocations.
CUresult mem_alloc(int device, CUdeviceptr* dptr, size_t size);
CUresult mem_free(CUdeviceptr dptr);
CUresult host_alloc(void** pp, size_t size, unsigned flags);
CUresult host_free(void* p);
CUresult host_register(void* p, size_t size, unsigned flags);
CUresult host_unregister(void* p);
CUresult get_info(int device, size_t* free_bytes, size_t* total_bytes);
CUresult set_external_usage(int device, uint64_t bytes);

// Managed memory (cuMemAllocManaged): process memory at one address for the
// host and every device, with a residency per granule (a device, the host, or
// not yet populated). Residency changes when the op that moves it is enqueued
// (prefetch, kernel launch), in call order, like every other "where does this
// memory live" decision of the sim; the cost lands at the op's virtual time.
CUresult managed_alloc(int device, CUdeviceptr* dptr, size_t size, unsigned flags);
// [ptr, ptr + count) lies inside one managed allocation.
bool is_managed_range(uintptr_t ptr, size_t count);
// What a residency change moved, in bytes.
struct Migration {
  uint64_t to_device = 0;  // host -> device transfers
  uint64_t to_host = 0;    // device -> host transfers, evictions included
  uint64_t evicted = 0;    // the part of to_host made to free room on a device
  uint64_t remote = 0;     // bytes a kernel reads in place over the link
};
// cuMemPrefetchAsync after validation: moves the granules of the
// (page-rounded) range to `target` (DEVICE or HOST/HOST_NUMA id 0).
Migration managed_prefetch(uintptr_t ptr, size_t count, const CUmemLocation& target);
// A kernel on `device` touching the managed allocations starting at `bases`.
Migration managed_kernel_touch(int device, const std::vector<uintptr_t>& bases);
// cuMemAdvise after validation of the location for `advice`.
void managed_advise(uintptr_t ptr, size_t count, CUmem_advise advice, const CUmemLocation& loc);
CUresult managed_range_attribute(void* data, size_t size, CUmem_range_attribute attribute,
                                 uintptr_t ptr, size_t count);
// Bytes of [ptr, ptr + size) resident on any device (simcuda.h).
uint64_t managed_device_bytes(uintptr_t ptr, size_t size);
// True if any granule of [ptr, ptr + n) of a managed allocation is on a device.
bool managed_on_device(uintptr_t ptr, size_t n);

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
  // Managed memory: `where` is kDevice or kHostMapped after the residency of
  // the granule holding the address, `mapping` the whole allocation.
  bool managed = false;
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
