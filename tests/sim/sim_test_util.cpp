#include "sim_test_util.h"

#include <chrono>
#include <cstring>
#include <thread>

namespace simtest {

CUcontext init_primary() {
  EXPECT_EQ(CUDA_SUCCESS, cuInit(0));
  CUcontext ctx = nullptr;
  EXPECT_EQ(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&ctx, 0));
  EXPECT_EQ(CUDA_SUCCESS, cuCtxSetCurrent(ctx));
  return ctx;
}

CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  return p;
}

CUmemAllocationProp host_prop() {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  p.location.id = 0;
  return p;
}

size_t granularity() {
  size_t g = 0;
  CUmemAllocationProp p = device_prop();
  EXPECT_EQ(CUDA_SUCCESS,
            cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  return g;
}

CUresult map_block(VmmBlock* b, size_t size, const CUmemAllocationProp& prop, bool grant) {
  b->size = size;
  if (CUresult e = cuMemAddressReserve(&b->ptr, size, 0, 0, 0); e != CUDA_SUCCESS) return e;
  if (CUresult e = cuMemCreate(&b->handle, size, &prop, 0); e != CUDA_SUCCESS) return e;
  if (CUresult e = cuMemMap(b->ptr, size, 0, b->handle, 0); e != CUDA_SUCCESS) return e;
  if (!grant) return CUDA_SUCCESS;
  CUmemAccessDesc acc{};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = 0;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return cuMemSetAccess(b->ptr, size, &acc, 1);
}

void unmap_block(const VmmBlock& b) {
  EXPECT_EQ(CUDA_SUCCESS, cuMemUnmap(b.ptr, b.size));
  EXPECT_EQ(CUDA_SUCCESS, cuMemRelease(b.handle));
  EXPECT_EQ(CUDA_SUCCESS, cuMemAddressFree(b.ptr, b.size));
}

namespace {
struct CopyArgs {
  void* dst;
  const void* src;
  size_t n;
};
void copy_fn(const void* params, size_t size, const simcuda_launch_info*, void*) {
  CopyArgs a;
  EXPECT_EQ(sizeof a, size);
  std::memcpy(&a, params, sizeof a);
  std::memcpy(a.dst, a.src, a.n);
}
void sleep_fn(const void* params, size_t, const simcuda_launch_info*, void*) {
  uint64_t us;
  std::memcpy(&us, params, sizeof us);
  std::this_thread::sleep_for(std::chrono::microseconds(us));
}
}  // namespace

CUfunction copy_kernel(uint64_t duration_ns) {
  static const size_t sizes[] = {8, 8, 8};
  simcuda_kernel_desc d{};
  d.name = "copy_kernel";
  d.fn = copy_fn;
  d.param_sizes = sizes;
  d.num_params = 3;
  d.duration_ns = duration_ns;
  CUfunction f = nullptr;
  EXPECT_EQ(CUDA_SUCCESS, simcuda_register_function(&d, &f));
  return f;
}

CUfunction sleep_kernel(uint64_t duration_ns) {
  static const size_t sizes[] = {8};
  simcuda_kernel_desc d{};
  d.name = "sleep_kernel";
  d.fn = sleep_fn;
  d.param_sizes = sizes;
  d.num_params = 1;
  d.duration_ns = duration_ns;
  CUfunction f = nullptr;
  EXPECT_EQ(CUDA_SUCCESS, simcuda_register_function(&d, &f));
  return f;
}

CUresult launch(CUfunction f, CUstream s, void** params) {
  return cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr);
}

}  // namespace simtest
