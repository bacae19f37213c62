#include "backing.h"

#include "log.h"

namespace spillway {

std::unique_ptr<Backing> make_backing(const BackingParts& parts, bool managed, bool evict) {
  const cu::Driver& d = parts.d;
  CUdevice dev = 0;
  d.cuDeviceGet(&dev, parts.device);
  if (managed) {
    // Without concurrent managed access the GPU cannot be prefetched to while
    // other work runs (and the host may not touch managed memory while
    // kernels run).
    int concurrent = 0;
    if (d.cuDeviceGetAttribute(&concurrent, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, dev) ==
            CUDA_SUCCESS &&
        concurrent)
      return make_managed_backing(parts);
    log::warn(
        "device {} has no concurrent managed access "
        "(CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS is 0): SPILLWAY_MODE=managed cannot "
        "evict; eviction and the budget are off, spillway only caches allocations",
        parts.device);
    return make_host_backing(parts, false);
  }
  // SPILLWAY_MODE=off: the allocator never asks it to evict.
  if (!evict) return make_host_backing(parts, true);
  int host_vmm = 0;
  if (d.cuDeviceGetAttribute(&host_vmm,
                             CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                             dev) == CUDA_SUCCESS &&
      host_vmm)
    return make_host_backing(parts, true);
  // No host memory to evict to.
  log::warn(
      "device {} cannot map host memory into its address space "
      "(CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0): eviction "
      "and the budget are off, spillway only caches allocations",
      parts.device);
  return make_host_backing(parts, false);
}

}  // namespace spillway
