// Kernels: registration, parameter layout queries, every launch entry point
// and the packed parameter buffer they deliver, library kernels (CUkernel),
// illegal addresses and declared durations.
#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "sim_test_extra.h"

using namespace simtest;

namespace {

// What a recording kernel saw, one entry per run.
struct Seen {
  std::mutex mu;
  std::vector<std::vector<unsigned char>> params;
  std::vector<simcuda_launch_info> info;
  size_t count() {
    std::lock_guard lk(mu);
    return params.size();
  }
};

void record_fn(const void* params, size_t size, const simcuda_launch_info* info, void* user) {
  auto* seen = static_cast<Seen*>(user);
  std::lock_guard lk(seen->mu);
  const auto* p = static_cast<const unsigned char*>(params);
  seen->params.emplace_back(p, p + size);
  seen->info.push_back(*info);
}

simcuda_kernel_desc recording_desc(const char* name, const size_t* sizes, size_t n, Seen* seen,
                                   uint64_t duration_ns = 1000) {
  simcuda_kernel_desc d{};
  d.name = name;
  d.fn = record_fn;
  d.user = seen;
  d.param_sizes = sizes;
  d.num_params = n;
  d.duration_ns = duration_ns;
  return d;
}

// The layout {4, 8, 2, 16}: natural alignment capped at 8 (simcuda.h).
constexpr size_t kSizes[] = {4, 8, 2, 16};
constexpr size_t kOffsets[] = {0, 8, 16, 24};
constexpr size_t kPackedSize = 40;

struct Args {
  uint32_t a = 0x11223344u;
  uint64_t b = 0x8877665544332211ull;
  uint16_t c = 0xBEEF;
  std::array<unsigned char, 16> d{};
  Args() {
    for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<unsigned char>(0xA0 + i);
  }
  std::array<void*, 4> params() { return {&a, &b, &c, d.data()}; }
  std::vector<unsigned char> packed() const {
    std::vector<unsigned char> buf(kPackedSize, 0);
    std::memcpy(buf.data() + kOffsets[0], &a, 4);
    std::memcpy(buf.data() + kOffsets[1], &b, 8);
    std::memcpy(buf.data() + kOffsets[2], &c, 2);
    std::memcpy(buf.data() + kOffsets[3], d.data(), 16);
    return buf;
  }
};

}  // namespace

TEST(SimKernels, FuncGetParamInfoReportsTheRegisteredLayout) {
  init_primary();
  Seen seen;
  simcuda_kernel_desc d = recording_desc("layout_kernel", kSizes, 4, &seen);
  CUfunction f = nullptr;
  ASSERT_CU(simcuda_register_function(&d, &f));
  for (size_t i = 0; i < 4; ++i) {
    size_t off = 99, size = 99;
    ASSERT_CU(cuFuncGetParamInfo(f, i, &off, &size)) << i;
    EXPECT_EQ(kOffsets[i], off) << "param " << i;
    EXPECT_EQ(kSizes[i], size) << "param " << i;
  }
  size_t off = 0, size = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuFuncGetParamInfo(f, 4, &off, &size))
      << "cuda.h: paramIndex must be less than the number of parameters";
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuFuncGetParamInfo(f, 1000, &off, &size));

  // Another layout: sizes 1, 4, 8, 2, 8, 3 -> each at its natural alignment.
  static const size_t sizes2[] = {1, 4, 8, 2, 8, 3};
  static const size_t offsets2[] = {0, 4, 8, 16, 24, 32};
  simcuda_kernel_desc d2 = recording_desc("layout_kernel2", sizes2, 6, &seen);
  CUfunction f2 = nullptr;
  ASSERT_CU(simcuda_register_function(&d2, &f2));
  for (size_t i = 0; i < 6; ++i) {
    ASSERT_CU(cuFuncGetParamInfo(f2, i, &off, &size));
    EXPECT_EQ(offsets2[i], off) << "param " << i;
    EXPECT_EQ(sizes2[i], size) << "param " << i;
  }
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuFuncGetParamInfo(f2, 6, &off, &size));

  // Explicit alignments, as a compiler lays out a float4 (16) after an int.
  static const size_t sizes3[] = {4, 16, 4};
  static const size_t aligns3[] = {4, 16, 4};
  static const size_t offsets3[] = {0, 16, 32};
  simcuda_kernel_desc d3 = recording_desc("layout_kernel3", sizes3, 3, &seen);
  d3.param_aligns = aligns3;
  CUfunction f3 = nullptr;
  ASSERT_CU(simcuda_register_function(&d3, &f3));
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_CU(cuFuncGetParamInfo(f3, i, &off, &size));
    EXPECT_EQ(offsets3[i], off) << "param " << i;
  }
  static const size_t bad_aligns[] = {4, 12, 4};
  d3.param_aligns = bad_aligns;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, simcuda_register_function(&d3, &f3));

  // A kernel receives exactly that packed buffer.
  Args args;
  auto params = args.params();
  ASSERT_CU(launch(f, nullptr, params.data()));
  ASSERT_CU(cuStreamSynchronize(nullptr));
  std::lock_guard lk(seen.mu);
  ASSERT_EQ(1u, seen.params.size());
  EXPECT_EQ(args.packed(), seen.params[0]);
}

TEST(SimKernels, FuncGetNameReturnsTheRegisteredName) {
  init_primary();
  Seen seen;
  simcuda_kernel_desc d = recording_desc("my_fancy_kernel<float, 4>", nullptr, 0, &seen);
  CUfunction f = nullptr;
  ASSERT_CU(simcuda_register_function(&d, &f));
  const char* name = nullptr;
  ASSERT_CU(cuFuncGetName(&name, f));
  ASSERT_NE(nullptr, name);
  EXPECT_STREQ("my_fancy_kernel<float, 4>", name);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuFuncGetName(nullptr, f));
}

// A library kernel (CUkernel): cuKernel* queries work on it, cuFunc* ones do
// not, cuLaunchKernel accepts it cast to CUfunction (CUDA 12+), and
// cuKernelGetFunction gives a CUfunction for the cuFunc* queries.
TEST(SimKernels, LibraryKernelQueriesAndLaunches) {
  init_primary();
  Seen seen;
  simcuda_kernel_desc d = recording_desc("library_kernel", kSizes, 4, &seen);
  CUkernel k = nullptr;
  ASSERT_CU(simcuda_register_kernel(&d, &k));

  size_t off = 0, size = 0;
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_CU(cuKernelGetParamInfo(k, i, &off, &size));
    EXPECT_EQ(kOffsets[i], off);
    EXPECT_EQ(kSizes[i], size);
  }
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuKernelGetParamInfo(k, 4, &off, &size));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE,
            cuFuncGetParamInfo(reinterpret_cast<CUfunction>(k), 0, &off, &size))
      << "a CUkernel is not a CUfunction for cuFuncGetParamInfo";
  const char* name = nullptr;
  ASSERT_CU(cuKernelGetName(&name, k));
  EXPECT_STREQ("library_kernel", name);

  Args args;
  auto params = args.params();
  ASSERT_CU(launch(reinterpret_cast<CUfunction>(k), nullptr, params.data()));

  CUfunction f = nullptr;
  ASSERT_CU(cuKernelGetFunction(&f, k));
  ASSERT_NE(nullptr, f);
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_CU(cuFuncGetParamInfo(f, i, &off, &size));
    EXPECT_EQ(kOffsets[i], off);
    EXPECT_EQ(kSizes[i], size);
  }
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuFuncGetParamInfo(f, 4, &off, &size));
  name = nullptr;
  ASSERT_CU(cuFuncGetName(&name, f));
  EXPECT_STREQ("library_kernel", name);
  ASSERT_CU(launch(f, nullptr, params.data()));

  ASSERT_CU(cuStreamSynchronize(nullptr));
  std::lock_guard lk(seen.mu);
  ASSERT_EQ(2u, seen.params.size());
  EXPECT_EQ(args.packed(), seen.params[0]);
  EXPECT_EQ(args.packed(), seen.params[1]);
}

// cuda.h (cuLaunchKernel): parameters may instead come packed in one buffer
// through `extra`; the kernel must see the same bytes either way.
TEST(SimKernels, ExtraBufferDeliversTheSamePackedBytesAsKernelParams) {
  init_primary();
  Seen seen;
  simcuda_kernel_desc d = recording_desc("extra_kernel", kSizes, 4, &seen);
  CUfunction f = nullptr;
  ASSERT_CU(simcuda_register_function(&d, &f));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

  Args args;
  auto params = args.params();
  ASSERT_CU(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params.data(), nullptr));
  // Pack by the offsets the driver reports, as a launcher would.
  std::vector<unsigned char> buf(kPackedSize, 0);
  for (size_t i = 0; i < 4; ++i) {
    size_t off = 0, size = 0;
    ASSERT_CU(cuFuncGetParamInfo(f, i, &off, &size));
    std::memcpy(buf.data() + off, params[i], size);
  }
  size_t buf_size = buf.size();
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf.data(), CU_LAUNCH_PARAM_BUFFER_SIZE,
                   &buf_size, CU_LAUNCH_PARAM_END};
  ASSERT_CU(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, nullptr, extra));
  ASSERT_CU(cuStreamSynchronize(s));

  std::lock_guard lk(seen.mu);
  ASSERT_EQ(2u, seen.params.size());
  EXPECT_EQ(kPackedSize, seen.params[0].size());
  EXPECT_EQ(seen.params[0], seen.params[1]);
  EXPECT_EQ(args.packed(), seen.params[1]);
  ASSERT_CU(cuStreamDestroy_v2(s));
}

TEST(SimKernels, BadLaunchArgumentsAreInvalidValueAndLaunchNothing) {
  init_primary();
  Seen seen;
  simcuda_kernel_desc d = recording_desc("refused_kernel", kSizes, 4, &seen);
  CUfunction f = nullptr;
  ASSERT_CU(simcuda_register_function(&d, &f));
  Args args;
  auto params = args.params();
  std::vector<unsigned char> buf(kPackedSize + 8, 0);

  // `extra` whose size is not the packed size.
  for (size_t wrong : {kPackedSize - 1, kPackedSize + 1, kPackedSize + 8, size_t{0}}) {
    size_t n = wrong;
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf.data(), CU_LAUNCH_PARAM_BUFFER_SIZE, &n,
                     CU_LAUNCH_PARAM_END};
    EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
              cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, extra))
        << "extra size " << wrong;
  }
  // `extra` missing the pointer or the size.
  size_t n = kPackedSize;
  void* no_ptr[] = {CU_LAUNCH_PARAM_BUFFER_SIZE, &n, CU_LAUNCH_PARAM_END};
  void* no_size[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf.data(), CU_LAUNCH_PARAM_END};
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, no_ptr));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, no_size));
  // cuda.h: both kernelParams and extra.
  void* good_extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf.data(), CU_LAUNCH_PARAM_BUFFER_SIZE, &n,
                        CU_LAUNCH_PARAM_END};
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, params.data(), good_extra));
  // A zero grid or block dimension.
  for (int i = 0; i < 6; ++i) {
    unsigned dim[6] = {1, 1, 1, 1, 1, 1};
    dim[i] = 0;
    EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(f, dim[0], dim[1], dim[2], dim[3], dim[4],
                                                       dim[5], 0, nullptr, params.data(), nullptr))
        << "dimension " << i;
  }
  CUlaunchConfig cfg{};
  cfg.gridDimX = 0;
  cfg.gridDimY = cfg.gridDimZ = cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuLaunchKernelEx(&cfg, f, params.data(), nullptr));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuLaunchCooperativeKernel(f, 1, 0, 1, 1, 1, 1, 0, nullptr, params.data()));

  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(0u, seen.count()) << "a refused launch must not run the kernel";
  // The function still launches fine.
  ASSERT_CU(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, params.data(), nullptr));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(1u, seen.count());
}

TEST(SimKernels, LaunchKernelExAndCooperativeLaunchRunWithTheirDimensions) {
  init_primary();
  Seen seen;
  simcuda_kernel_desc d = recording_desc("dims_kernel", kSizes, 4, &seen);
  CUfunction f = nullptr;
  ASSERT_CU(simcuda_register_function(&d, &f));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  Args args;
  auto params = args.params();

  CUlaunchConfig cfg{};
  cfg.gridDimX = 2;
  cfg.gridDimY = 3;
  cfg.gridDimZ = 4;
  cfg.blockDimX = 32;
  cfg.blockDimY = 2;
  cfg.blockDimZ = 1;
  cfg.hStream = s;
  ASSERT_CU(cuLaunchKernelEx(&cfg, f, params.data(), nullptr));
  ASSERT_CU(cuLaunchCooperativeKernel(f, 5, 1, 1, 64, 1, 1, 0, s, params.data()));
  ASSERT_CU(cuStreamSynchronize(s));

  std::lock_guard lk(seen.mu);
  ASSERT_EQ(2u, seen.params.size());
  for (const auto& p : seen.params) EXPECT_EQ(args.packed(), p);
  const simcuda_launch_info& ex = seen.info[0];
  EXPECT_EQ(s, ex.stream);
  EXPECT_EQ(2u, ex.grid[0]);
  EXPECT_EQ(3u, ex.grid[1]);
  EXPECT_EQ(4u, ex.grid[2]);
  EXPECT_EQ(32u, ex.block[0]);
  EXPECT_EQ(2u, ex.block[1]);
  EXPECT_EQ(1u, ex.block[2]);
  const simcuda_launch_info& coop = seen.info[1];
  EXPECT_EQ(s, coop.stream);
  EXPECT_EQ(5u, coop.grid[0]);
  EXPECT_EQ(64u, coop.block[0]);
  EXPECT_NE(ex.correlation_id, coop.correlation_id);
  ASSERT_CU(cuStreamDestroy_v2(s));
}

// cuGetProcAddress with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM gives
// cuLaunchKernel_ptsz, whose NULL stream is the calling thread's per-thread
// default stream, not the legacy one.
TEST(SimKernels, PerThreadLaunchThroughGetProcAddress) {
  init_primary();
  using LaunchFn = CUresult(CUDAAPI*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                      unsigned, unsigned, CUstream, void**, void**);
  void* legacy_pfn = nullptr;
  void* ptsz_pfn = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  ASSERT_CU(cuGetProcAddress_v2("cuLaunchKernel", &legacy_pfn, CUDA_VERSION,
                                CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(CU_GET_PROC_ADDRESS_SUCCESS, status);
  status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  ASSERT_CU(cuGetProcAddress_v2("cuLaunchKernel", &ptsz_pfn, CUDA_VERSION,
                                CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status));
  EXPECT_EQ(CU_GET_PROC_ADDRESS_SUCCESS, status);
  ASSERT_NE(nullptr, ptsz_pfn);
  EXPECT_EQ(reinterpret_cast<void*>(&cuLaunchKernel), legacy_pfn);
  EXPECT_NE(legacy_pfn, ptsz_pfn) << "expected the _ptsz variant";

  Seen seen;
  simcuda_kernel_desc d = recording_desc("ptsz_kernel", kSizes, 4, &seen, 10'000'000);
  CUfunction f = nullptr;
  ASSERT_CU(simcuda_register_function(&d, &f));
  Args args;
  auto params = args.params();
  quiesce();
  auto launch_ptsz = reinterpret_cast<LaunchFn>(ptsz_pfn);
  ASSERT_CU(launch_ptsz(f, 1, 1, 1, 1, 1, 1, 0, nullptr, params.data(), nullptr));
  // 10 ms of virtual time pending on the per-thread stream, none on legacy.
  EXPECT_EQ(CUDA_ERROR_NOT_READY, cuStreamQuery(CU_STREAM_PER_THREAD));
  EXPECT_CU(cuStreamQuery(CU_STREAM_LEGACY));
  ASSERT_CU(cuStreamSynchronize(CU_STREAM_PER_THREAD));
  std::lock_guard lk(seen.mu);
  ASSERT_EQ(1u, seen.params.size());
  EXPECT_EQ(args.packed(), seen.params[0]);
  EXPECT_EQ(CU_STREAM_PER_THREAD, seen.info[0].stream);
}

// A kernel that touches an unmapped device address: the context gets a
// sticky CUDA_ERROR_ILLEGAL_ADDRESS (every later call that needs it fails),
// queued work is dropped, the process survives, and simcuda_sticky_error
// names the kernel and the address.
TEST(SimKernels, IllegalAddressIsStickyForTheContext) {
  run_isolated({}, [] {
    init_primary();
    CUdeviceptr hole = 0;
    ASSERT_CU(cuMemAddressReserve(&hole, granularity(), 0, 0, 0));  // never mapped
    static const size_t sizes[] = {8};
    simcuda_kernel_desc bad{};
    bad.name = "poke_unmapped";
    bad.fn = [](const void* p, size_t, const simcuda_launch_info*, void*) {
      volatile uint64_t* addr;
      std::memcpy(&addr, p, sizeof addr);
      *addr = 42;
    };
    bad.param_sizes = sizes;
    bad.num_params = 1;
    bad.duration_ns = 1000;
    CUfunction bad_fn = nullptr;
    ASSERT_CU(simcuda_register_function(&bad, &bad_fn));

    CUstream s = nullptr;
    ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    Gate g;
    std::atomic<bool> after_ran{false};
    std::function<void()> hold = [&] { g.wait(); };
    std::function<void()> after = [&] { after_ran = true; };
    CUfunction call = call_kernel();
    ASSERT_CU(host_call(s, &hold));  // queue everything before the fault happens
    CUdeviceptr target = hole + 128;
    void* params[] = {&target};
    ASSERT_CU(launch(bad_fn, s, params));
    ASSERT_CU(launch_call(call, s, &after));
    g.open = true;

    EXPECT_EQ(CUDA_ERROR_ILLEGAL_ADDRESS, cuStreamSynchronize(s));
    EXPECT_FALSE(after_ran.load()) << "work queued after the fault must not run";
    CUdeviceptr d = 0;
    EXPECT_EQ(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemAlloc_v2(&d, 4096));
    EXPECT_EQ(CUDA_ERROR_ILLEGAL_ADDRESS, cuCtxSynchronize());
    EXPECT_EQ(CUDA_ERROR_ILLEGAL_ADDRESS, launch_call(call, s, &after));
    char what[256] = {};
    EXPECT_EQ(CUDA_ERROR_ILLEGAL_ADDRESS, simcuda_sticky_error(0, what, sizeof what));
    const std::string desc(what);
    EXPECT_NE(std::string::npos, desc.find("poke_unmapped")) << desc;
    char addr[32];
    std::snprintf(addr, sizeof addr, "%#llx", static_cast<unsigned long long>(target));
    EXPECT_NE(std::string::npos, desc.find(addr)) << desc << " should name " << addr;
  });
}

// duration_fn: the kernel's virtual duration is computed from its packed
// parameters (and user pointer) at launch.
TEST(SimKernels, DurationFnGivesTheKernelsVirtualDuration) {
  run_isolated({}, [] {
    init_primary();
    static const size_t sizes[] = {4, 8};  // (uint32_t scale, uint64_t elements)
    static uint64_t per_element = 3;
    struct Calls {
      std::atomic<int> n{0};
      std::atomic<size_t> size{0};
    };
    static Calls calls;
    simcuda_kernel_desc d{};
    d.name = "sized_kernel";
    d.fn = [](const void*, size_t, const simcuda_launch_info*, void*) {};
    d.user = &per_element;
    d.param_sizes = sizes;
    d.num_params = 2;
    d.duration_ns = 999'999'999;  // ignored when duration_fn is set
    d.duration_fn = [](const void* params, size_t size, void* user) -> uint64_t {
      calls.n++;
      calls.size = size;
      uint32_t scale;
      uint64_t elements;
      std::memcpy(&scale, params, 4);
      std::memcpy(&elements, static_cast<const char*>(params) + 8, 8);
      return scale * elements * *static_cast<uint64_t*>(user);
    };
    CUfunction f = nullptr;
    ASSERT_CU(simcuda_register_function(&d, &f));

    CUstream s = nullptr;
    ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUevent start = nullptr, mid = nullptr, end = nullptr;
    for (CUevent* e : {&start, &mid, &end}) ASSERT_CU(cuEventCreate(e, 0));
    uint32_t scale = 2;
    uint64_t elements = 1000;
    void* p1[] = {&scale, &elements};
    gate({s});
    ASSERT_CU(cuEventRecord(start, s));
    ASSERT_CU(launch(f, s, p1));  // 2 * 1000 * 3 = 6000 ns
    ASSERT_CU(cuEventRecord(mid, s));
    uint32_t scale2 = 5;
    uint64_t elements2 = 40'000;
    void* p2[] = {&scale2, &elements2};
    ASSERT_CU(launch(f, s, p2));  // 5 * 40000 * 3 = 600000 ns
    ASSERT_CU(cuEventRecord(end, s));
    ASSERT_CU(cuEventSynchronize(end));
    EXPECT_NEAR(6000.0, elapsed_ns(start, mid), 1.0);
    EXPECT_NEAR(600'000.0, elapsed_ns(mid, end), 1.0);
    EXPECT_EQ(2, calls.n.load());
    EXPECT_EQ(16u, calls.size.load());
    for (CUevent e : {start, mid, end}) ASSERT_CU(cuEventDestroy_v2(e));
    ASSERT_CU(cuStreamDestroy_v2(s));
  });
}
