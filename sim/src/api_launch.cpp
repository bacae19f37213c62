// Kernels: registration (simcuda.h), parameter layout queries and launches.
// A launch packs the arguments into the layout cuFuncGetParamInfo reports,
// as the hardware does, and runs the registered host function on the stream
// worker with that buffer.
#include <simcuda.h>

#include <cstring>

#include "api.h"
#include "graph.h"
#include "variants.h"
#include "memory.h"

using namespace sim;

namespace {

size_t align_of_param(size_t size) {
  size_t a = 1;
  while (a < 8 && size % (a * 2) == 0) a *= 2;
  return a;
}

CUresult register_desc(const simcuda_kernel_desc* d, bool library, uint64_t* id) {
  State* st = state();
  if (!st) return CUDA_ERROR_NOT_INITIALIZED;
  if (!d || !d->fn || !d->name || (d->num_params && !d->param_sizes))
    return refuse(CUDA_ERROR_INVALID_VALUE, "simcuda_register: incomplete descriptor");
  auto f = std::make_shared<Function>();
  f->name = d->name;
  f->fn = reinterpret_cast<void*>(d->fn);
  f->user = d->user;
  f->duration_ns = d->duration_ns;
  f->duration_fn = reinterpret_cast<void*>(d->duration_fn);
  f->library_kernel = library;
  Context* ctx = nullptr;
  if (current_context(&ctx) == CUDA_SUCCESS) f->device = ctx->device;
  size_t at = 0;
  for (size_t i = 0; i < d->num_params; ++i) {
    size_t size = d->param_sizes[i];
    if (size == 0) return refuse(CUDA_ERROR_INVALID_VALUE, "simcuda_register: zero-size param");
    size_t a = d->param_aligns ? d->param_aligns[i] : align_of_param(size);
    if (a == 0 || (a & (a - 1)) != 0)
      return refuse(CUDA_ERROR_INVALID_VALUE, "simcuda_register: alignment %zu not a power of 2",
                    a);
    at = (at + a - 1) / a * a;
    f->offsets.push_back(at);
    f->sizes.push_back(size);
    at += size;
  }
  f->params_size = at;
  *id = new_handle();
  std::lock_guard lk(st->handles_mu);
  (library ? st->kernels : st->functions)[*id] = f;
  return CUDA_SUCCESS;
}

// cuLaunchKernel takes a CUfunction or, since CUDA 12, a CUkernel.
std::shared_ptr<Function> find(uint64_t id, bool functions, bool kernels) {
  State* st = state();
  if (!st) return nullptr;
  std::lock_guard lk(st->handles_mu);
  if (functions)
    if (auto it = st->functions.find(id); it != st->functions.end()) return it->second;
  if (kernels)
    if (auto it = st->kernels.find(id); it != st->kernels.end()) return it->second;
  return nullptr;
}

CUresult param_info(const std::shared_ptr<Function>& f, size_t index, size_t* offset,
                    size_t* size) {
  // cuda.h (cuFuncGetParamInfo): an index past the last parameter is
  // CUDA_ERROR_INVALID_VALUE; callers loop until they get it.
  if (!f) return refuse(CUDA_ERROR_INVALID_HANDLE, "param info: unknown function or kernel");
  if (index >= f->sizes.size()) return CUDA_ERROR_INVALID_VALUE;
  if (offset) *offset = f->offsets[index];
  if (size) *size = f->sizes[index];
  return CUDA_SUCCESS;
}

struct Dims {
  unsigned grid[3];
  unsigned block[3];
};

CUresult launch(const char* api, CUfunction handle, const Dims& dims, CUstream h, void** params,
                void** extra) {
  SIM_CTX(ctx);
  std::shared_ptr<Stream> s;
  if (CUresult e = stream::resolve(ctx, h, &s); e != CUDA_SUCCESS) return e;
  auto f = find(reinterpret_cast<uint64_t>(handle), true, true);
  if (!f) return refuse(CUDA_ERROR_INVALID_HANDLE, "%s: unknown function %p", api, handle);
  for (int i = 0; i < 3; ++i)
    if (dims.grid[i] == 0 || dims.block[i] == 0)
      return refuse(CUDA_ERROR_INVALID_VALUE, "%s: zero grid or block dimension", api);
  if (uint64_t{dims.block[0]} * dims.block[1] * dims.block[2] > 1024)
    return refuse(CUDA_ERROR_INVALID_VALUE, "%s: more than 1024 threads per block", api);

  auto buf = std::make_shared<std::vector<unsigned char>>(f->params_size);
  if (params && extra)
    return refuse(CUDA_ERROR_INVALID_VALUE, "%s: both kernelParams and extra given", api);
  if (extra) {
    void* ptr = nullptr;
    size_t* size = nullptr;
    for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
        ptr = extra[i + 1];
      else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
        size = static_cast<size_t*>(extra[i + 1]);
      else
        return refuse(CUDA_ERROR_INVALID_VALUE, "%s: unknown extra option %p", api, extra[i]);
    }
    if (!ptr || !size || *size != f->params_size)
      return refuse(CUDA_ERROR_INVALID_VALUE, "%s: extra buffer missing or not %zu bytes", api,
                    f->params_size);
    std::memcpy(buf->data(), ptr, f->params_size);
  } else if (!f->sizes.empty()) {
    if (!params) return refuse(CUDA_ERROR_INVALID_VALUE, "%s: no kernelParams", api);
    for (size_t i = 0; i < f->sizes.size(); ++i)
      std::memcpy(buf->data() + f->offsets[i], params[i], f->sizes[i]);
  }

  // cuda.h (cuLaunchKernel): the parameters are copied when the launch is
  // made; a captured launch keeps its copy for every replay. Everything that
  // depends on where memory lives (touched mappings, remote reads) is worked
  // out when the op is enqueued, so a replay sees the residency of its time.
  graph::Emit emit = [f, buf = std::move(buf), dims](const std::shared_ptr<Stream>& st,
                                                     CUstream user) -> std::shared_ptr<Op> {
    // Each run gets its own buffer: a kernel may write to its parameters.
    auto run_buf = std::make_shared<std::vector<unsigned char>>(*buf);
    auto op = std::make_shared<Op>();
    op->kind = Op::Kind::kKernel;
    op->engine = Engine::kCompute;
    op->what = "kernel " + f->name;
    // Every aligned word that points into a mapping marks that mapping as used
    // by this kernel (so it cannot be unmapped under it). Host-located mappings
    // are read over the link: charge their bytes at link speed (slow, correct).
    uint64_t remote = 0;
    std::vector<uintptr_t> managed;  // bases of the managed allocations it touches
    for (size_t off = 0; off + 8 <= run_buf->size(); off += 8) {
      uint64_t word;
      std::memcpy(&word, run_buf->data() + off, 8);
      mem::Located at = mem::locate(static_cast<uintptr_t>(word));
      if (at.where != mem::Where::kDevice && at.where != mem::Where::kHostMapped) continue;
      bool seen = false;
      for (const Range& r : op->touched) seen = seen || (r.lo == at.mapping.lo);
      if (seen) continue;
      op->touched.push_back(at.mapping);
      if (at.managed)
        managed.push_back(at.mapping.lo);
      else if (at.where == mem::Where::kHostMapped)
        remote += at.mapping.hi - at.mapping.lo;
    }
    // Managed memory: the whole allocation a parameter points into counts as
    // touched (the sim cannot see which pages the kernel uses: costlier than
    // hardware). Host-resident granules migrate before the kernel runs (page
    // faults), slower than a prefetch; what cannot be placed is read remotely.
    const int device = st->ctx->device;
    mem::Migration mig;
    if (!managed.empty()) mig = mem::managed_kernel_touch(device, managed);
    remote += mig.remote;
    const Config& cfg = state()->config;
    uint64_t duration = f->duration_fn ? reinterpret_cast<simcuda_duration_fn>(f->duration_fn)(
                                             run_buf->data(), run_buf->size(), f->user)
                                       : f->duration_ns;
    duration += static_cast<uint64_t>(static_cast<double>(remote) / cfg.h2d_bytes_per_ns);
    duration += static_cast<uint64_t>(static_cast<double>(mig.to_device + mig.to_host) /
                                      cfg.fault_bytes_per_ns);

    simcuda_launch_info info{};
    info.stream = user;
    std::memcpy(info.grid, dims.grid, sizeof info.grid);
    std::memcpy(info.block, dims.block, sizeof info.block);
    info.correlation_id = api::current_correlation();
    auto fn = reinterpret_cast<simcuda_kernel_fn>(f->fn);
    void* fuser = f->user;
    op->effect = [fn, run_buf, info, fuser] { fn(run_buf->data(), run_buf->size(), &info, fuser); };
    op->report_activity = true;
    op->activity.kind = simbridge::Activity::Kind::kKernel;
    op->activity.correlation_id = info.correlation_id;
    op->activity.name = f->name.c_str();  // functions are never freed
    std::memcpy(op->activity.grid, dims.grid, sizeof dims.grid);
    std::memcpy(op->activity.block, dims.block, sizeof dims.block);
    stream::enqueue(st, op, [&](Device& dev, uint64_t earliest) {
      return clock::schedule_fixed(dev, Engine::kCompute, earliest, duration);
    });
    Device& dev = *state()->devices[static_cast<size_t>(device)];
    if (remote) dev.remote_access_bytes += remote;
    dev.bytes_h2d += mig.to_device;
    dev.managed_fault_bytes += mig.to_device;
    dev.bytes_d2h += mig.to_host;
    return op;
  };
  bool captured = false;
  if (CUresult e = graph::intercept(s, api, false, emit, &captured); captured) return e;
  emit(s, h);
  return CUDA_SUCCESS;
}

CUstream per_thread(CUstream s) {
  return s ? s : CU_STREAM_PER_THREAD;
}

}  // namespace

extern "C" {

CUresult simcuda_register_function(const simcuda_kernel_desc* desc, CUfunction* out) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  uint64_t id = 0;
  CUresult e = register_desc(desc, false, &id);
  if (e == CUDA_SUCCESS) *out = reinterpret_cast<CUfunction>(id);
  return e;
}

CUresult simcuda_register_kernel(const simcuda_kernel_desc* desc, CUkernel* out) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  uint64_t id = 0;
  CUresult e = register_desc(desc, true, &id);
  if (e == CUDA_SUCCESS) *out = reinterpret_cast<CUkernel>(id);
  return e;
}

CUresult CUDAAPI cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t* paramOffset,
                                    size_t* paramSize) {
  cuFuncGetParamInfo_params p_{func, paramIndex, paramOffset, paramSize};
  return SIM_INVOKE(cuFuncGetParamInfo, p_, [&] {
    if (!state()) return CUDA_ERROR_NOT_INITIALIZED;
    // A CUkernel is not a CUfunction: use cuKernelGetParamInfo for it.
    return param_info(find(reinterpret_cast<uint64_t>(func), true, false), paramIndex, paramOffset,
                      paramSize);
  });
}

CUresult CUDAAPI cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex, size_t* paramOffset,
                                      size_t* paramSize) {
  cuKernelGetParamInfo_params p_{kernel, paramIndex, paramOffset, paramSize};
  return SIM_INVOKE(cuKernelGetParamInfo, p_, [&] {
    if (!state()) return CUDA_ERROR_NOT_INITIALIZED;
    return param_info(find(reinterpret_cast<uint64_t>(kernel), false, true), paramIndex,
                      paramOffset, paramSize);
  });
}

CUresult CUDAAPI cuFuncGetName(const char** name, CUfunction hfunc) {
  cuFuncGetName_params p_{name, hfunc};
  return SIM_INVOKE(cuFuncGetName, p_, [&] {
    auto f = find(reinterpret_cast<uint64_t>(hfunc), true, false);
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    if (!f) return refuse(CUDA_ERROR_INVALID_HANDLE, "cuFuncGetName: unknown function");
    *name = f->name.c_str();
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuKernelGetName(const char** name, CUkernel hfunc) {
  cuKernelGetName_params p_{name, hfunc};
  return SIM_INVOKE(cuKernelGetName, p_, [&] {
    auto f = find(reinterpret_cast<uint64_t>(hfunc), false, true);
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    if (!f) return refuse(CUDA_ERROR_INVALID_HANDLE, "cuKernelGetName: unknown kernel");
    *name = f->name.c_str();
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuKernelGetFunction(CUfunction* pFunc, CUkernel kernel) {
  cuKernelGetFunction_params p_{pFunc, kernel};
  return SIM_INVOKE(cuKernelGetFunction, p_, [&] {
    SIM_NEED_CTX();
    auto f = find(reinterpret_cast<uint64_t>(kernel), false, true);
    if (!pFunc) return CUDA_ERROR_INVALID_VALUE;
    if (!f) return refuse(CUDA_ERROR_INVALID_HANDLE, "cuKernelGetFunction: unknown kernel");
    // The context's function for a library kernel: same code, CUfunction handle.
    State& st = *state();
    std::lock_guard lk(st.handles_mu);
    uint64_t id = (st.next_handle += 0x10);
    st.functions[id] = f;
    *pFunc = reinterpret_cast<CUfunction>(id);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                unsigned int gridDimZ, unsigned int blockDimX,
                                unsigned int blockDimY, unsigned int blockDimZ,
                                unsigned int sharedMemBytes, CUstream hStream, void** kernelParams,
                                void** extra) {
  Dims d{{gridDimX, gridDimY, gridDimZ}, {blockDimX, blockDimY, blockDimZ}};
  cuLaunchKernel_params p_{f,         gridDimX,       gridDimY, gridDimZ,     blockDimX, blockDimY,
                           blockDimZ, sharedMemBytes, hStream,  kernelParams, extra};
  return SIM_INVOKE_LAUNCH(cuLaunchKernel, p_, [&] {
    return launch("cuLaunchKernel", f, d, hStream, kernelParams, extra);
  });
}

CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                     unsigned int gridDimZ, unsigned int blockDimX,
                                     unsigned int blockDimY, unsigned int blockDimZ,
                                     unsigned int sharedMemBytes, CUstream hStream,
                                     void** kernelParams, void** extra) {
  Dims d{{gridDimX, gridDimY, gridDimZ}, {blockDimX, blockDimY, blockDimZ}};
  cuLaunchKernel_ptsz_params p_{f,         gridDimX,     gridDimY,  gridDimZ,
                                blockDimX, blockDimY,    blockDimZ, sharedMemBytes,
                                hStream,   kernelParams, extra};
  return SIM_INVOKE_LAUNCH(cuLaunchKernel_ptsz, p_, [&] {
    return launch("cuLaunchKernel", f, d, per_thread(hStream), kernelParams, extra);
  });
}

CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** kernelParams,
                                  void** extra) {
  cuLaunchKernelEx_params p_{config, f, kernelParams, extra};
  return SIM_INVOKE_LAUNCH(cuLaunchKernelEx, p_, [&] {
    if (!config) return refuse(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernelEx: null config");
    Dims d{{config->gridDimX, config->gridDimY, config->gridDimZ},
           {config->blockDimX, config->blockDimY, config->blockDimZ}};
    return launch("cuLaunchKernelEx", f, d, config->hStream, kernelParams, extra);
  });
}

CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f,
                                       void** kernelParams, void** extra) {
  cuLaunchKernelEx_ptsz_params p_{config, f, kernelParams, extra};
  return SIM_INVOKE_LAUNCH(cuLaunchKernelEx_ptsz, p_, [&] {
    if (!config) return refuse(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernelEx: null config");
    Dims d{{config->gridDimX, config->gridDimY, config->gridDimZ},
           {config->blockDimX, config->blockDimY, config->blockDimZ}};
    return launch("cuLaunchKernelEx", f, d, per_thread(config->hStream), kernelParams, extra);
  });
}

CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX,
                                           unsigned int gridDimY, unsigned int gridDimZ,
                                           unsigned int blockDimX, unsigned int blockDimY,
                                           unsigned int blockDimZ, unsigned int sharedMemBytes,
                                           CUstream hStream, void** kernelParams) {
  Dims d{{gridDimX, gridDimY, gridDimZ}, {blockDimX, blockDimY, blockDimZ}};
  cuLaunchCooperativeKernel_params p_{f,         gridDimX,  gridDimY,       gridDimZ, blockDimX,
                                      blockDimY, blockDimZ, sharedMemBytes, hStream,  kernelParams};
  return SIM_INVOKE_LAUNCH(cuLaunchCooperativeKernel, p_, [&] {
    return launch("cuLaunchCooperativeKernel", f, d, hStream, kernelParams, nullptr);
  });
}

CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                                unsigned int gridDimY, unsigned int gridDimZ,
                                                unsigned int blockDimX, unsigned int blockDimY,
                                                unsigned int blockDimZ, unsigned int sharedMemBytes,
                                                CUstream hStream, void** kernelParams) {
  Dims d{{gridDimX, gridDimY, gridDimZ}, {blockDimX, blockDimY, blockDimZ}};
  cuLaunchCooperativeKernel_ptsz_params p_{f,         gridDimX,    gridDimY,  gridDimZ,
                                           blockDimX, blockDimY,   blockDimZ, sharedMemBytes,
                                           hStream,   kernelParams};
  return SIM_INVOKE_LAUNCH(cuLaunchCooperativeKernel_ptsz, p_, [&] {
    return launch("cuLaunchCooperativeKernel", f, d, per_thread(hStream), kernelParams, nullptr);
  });
}

}  // extern "C"
