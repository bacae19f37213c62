/* simcuda.h: the sim-only API of the simulated GPU (build/sim/libcuda.so.1).
 *
 * Nothing here exists on a real driver. Tests and the replay harness use it to
 * register host functions as kernels, read the virtual clock and counters, and
 * inject faults. Everything else goes through the real CUDA driver API
 * (cuda.h), exactly as on hardware. See docs/sim.md.
 */
#ifndef SIMCUDA_H
#define SIMCUDA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Kernels ------------------------------------------------------------
 * A simulated kernel is a host function run on the stream's worker thread.
 * It receives the packed parameter buffer (laid out as cuFuncGetParamInfo
 * reports) and may dereference device pointers: device memory is process
 * memory. An access to an unmapped or inaccessible address is caught and
 * turned into a sticky CUDA_ERROR_ILLEGAL_ADDRESS for the context. */

typedef struct simcuda_launch_info {
  CUstream stream; /* the stream the kernel was launched on */
  unsigned grid[3];
  unsigned block[3];
  uint32_t correlation_id; /* the CUPTI correlation id of the launch */
} simcuda_launch_info;

typedef void (*simcuda_kernel_fn)(const void* params, size_t params_size,
                                  const simcuda_launch_info* info, void* user);

/* Returns the kernel's simulated duration in nanoseconds, computed from its
 * packed parameters. NULL means the fixed duration given at registration. */
typedef uint64_t (*simcuda_duration_fn)(const void* params, size_t params_size, void* user);

typedef struct simcuda_kernel_desc {
  const char* name; /* reported to CUPTI (activity and callbacks) */
  simcuda_kernel_fn fn;
  void* user;
  const size_t* param_sizes; /* size in bytes of each parameter */
  size_t num_params;
  uint64_t duration_ns; /* used when duration_fn is NULL */
  simcuda_duration_fn duration_fn;
  /* Optional alignment of each parameter (a power of two), as the compiler
   * lays them out: a float4 is 16-byte aligned. NULL: natural alignment of
   * the size, capped at 8. */
  const size_t* param_aligns;
} simcuda_kernel_desc;

/* Registers a kernel in the current context's device. Returns a CUfunction
 * usable with cuLaunchKernel / cuLaunchKernelEx / cuFuncGetParamInfo. */
CUresult simcuda_register_function(const simcuda_kernel_desc* desc, CUfunction* out);
/* Same, as a library kernel (CUkernel): cuKernelGetParamInfo works on it, and
 * it may be passed to cuLaunchKernel cast to CUfunction (CUDA 12+ semantics). */
CUresult simcuda_register_kernel(const simcuda_kernel_desc* desc, CUkernel* out);

/* ---- Runtime-domain emulation -------------------------------------------
 * There is no simulated libcudart. This stands in for one
 * cudaLaunchKernel(func, grid, block, args, sharedMem, stream): it fires the
 * CUPTI runtime-domain callback CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000
 * at enter (params: cudaLaunchKernel_v7000_params, func = the CUfunction),
 * calls cuLaunchKernel (whose driver-domain callbacks fire nested inside, with
 * their own correlation id), then fires the runtime exit callback with the
 * result as a cudaError_t. Returns the driver's result. */
typedef struct simcuda_dim3 {
  unsigned x, y, z;
} simcuda_dim3;
CUresult simcuda_runtime_launch(CUfunction f, simcuda_dim3 grid, simcuda_dim3 block, void** args,
                                size_t shared_mem, CUstream stream);

/* ---- Virtual clock ------------------------------------------------------ */
/* The calling thread's virtual host time, in simulated nanoseconds. */
uint64_t simcuda_now_ns(void);
/* Advance the calling thread's virtual host time (host work between calls). */
void simcuda_host_advance_ns(uint64_t ns);
/* The virtual time at which all work queued so far on the device completes. */
uint64_t simcuda_device_idle_at_ns(int device);

/* ---- Counters ----------------------------------------------------------- */
/* Number of calls of a driver entry point by exported name, e.g.
 * "cuMemCreate" or "cuMemcpyHtoDAsync_v2" (base names count all variants). */
uint64_t simcuda_call_count(const char* name);
/* The virtual host time one call of a driver entry point (not a launch)
 * costs, as configured (SIMCUDA_API_NS, SIMCUDA_VMM_NS, SIMCUDA_CALL_NS);
 * 0 before cuInit. */
uint64_t simcuda_call_cost_ns(const char* name);

typedef struct simcuda_memory_stats {
  uint64_t device_capacity;
  uint64_t device_used; /* device physical memory: cuMemCreate + cuMemAlloc + device-resident
                          managed memory + external */
  uint64_t device_peak;
  uint64_t host_capacity;
  uint64_t host_used; /* host-located cuMemCreate + pinned host allocations */
  uint64_t host_peak;
  uint64_t bytes_h2d; /* bytes moved by the copy engines, each way */
  uint64_t bytes_d2h;
  uint64_t remote_access_bytes; /* bytes of host-backed mappings touched by kernels */
  /* managed bytes kernels migrated to the device on first access (page
   * faults); also counted in bytes_h2d. Prefetches are not counted here. */
  uint64_t managed_fault_bytes;
} simcuda_memory_stats;
void simcuda_get_memory_stats(int device, simcuda_memory_stats* out);

/* Managed memory (cuMemAllocManaged): the bytes of [ptr, ptr + size) that are
 * resident on a device (any device) now. Residency is tracked per granule
 * (SIMCUDA_GRANULARITY) and changes when a prefetch or a kernel that migrates
 * is enqueued. 0 for memory that is not managed. */
uint64_t simcuda_managed_device_bytes(CUdeviceptr ptr, size_t size);

/* A hash of the mappings overlapping [ptr, ptr + size): each mapping made
 * (cuMemMap, cuMemAlloc, cuMemAllocManaged) and each cuMemSetAccess on one
 * gets a new serial. So while the range stays mapped, two readings differ if
 * anything was unmapped, remapped (even to the same memory) or had its access
 * set in between; a range unmapped at both readings reads the same. Read
 * under the lock that orders those changes, so a concurrent change elsewhere
 * cannot tear a reading. */
uint64_t simcuda_mapping_signature(CUdeviceptr ptr, size_t size);

/* Device memory taken by "another process": counts against capacity. */
CUresult simcuda_set_external_usage(int device, uint64_t bytes);

/* ---- Errors and faults --------------------------------------------------- */
/* The context's sticky error (CUDA_SUCCESS if none), and a description of
 * the first illegal access (address, which kernel or copy) in `buf`. */
CUresult simcuda_sticky_error(int device, char* buf, size_t len);

/* Make the nth (1-based) call of `name` made from now on fail with `error`;
 * with `and_after`, that call and every later one. SIMCUDA_FAIL=name:n[+][:ERROR]
 * does the same counting from cuInit. */
CUresult simcuda_fail_call(const char* name, uint64_t nth, int and_after, CUresult error);
void simcuda_clear_faults(void);

#ifdef __cplusplus
}
#endif
#endif /* SIMCUDA_H */
