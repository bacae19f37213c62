#include "sim_gpu.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <thread>

namespace simcupti_test {

::testing::AssertionResult LoadedFrom(const void* symbol, const char* expected_file) {
  Dl_info info{};
  if (dladdr(symbol, &info) == 0 || info.dli_fname == nullptr)
    return ::testing::AssertionFailure() << "dladdr found no object for the symbol";
  char loaded[PATH_MAX];
  char expected[PATH_MAX];
  if (realpath(info.dli_fname, loaded) == nullptr || realpath(expected_file, expected) == nullptr)
    return ::testing::AssertionFailure()
           << "cannot resolve " << info.dli_fname << " or " << expected_file;
  if (std::string(loaded) != expected)
    return ::testing::AssertionFailure() << "loaded from " << loaded << ", expected " << expected;
  return ::testing::AssertionSuccess();
}

namespace {

// The kernel: params are (CUdeviceptr out, uint32_t value).
void StoreValue(const void* params, size_t params_size, const simcuda_launch_info*, void*) {
  CUdeviceptr out;
  uint32_t value;
  if (params_size < sizeof out + sizeof value) return;
  std::memcpy(&out, params, sizeof out);
  std::memcpy(&value, static_cast<const char*>(params) + sizeof out, sizeof value);
  std::memcpy(reinterpret_cast<void*>(out), &value, sizeof value);
}

constexpr size_t kParamSizes[] = {sizeof(CUdeviceptr), sizeof(uint32_t)};

}  // namespace

void SimGpuTest::SetUp() {
  ASSERT_TRUE(LoadedFrom(reinterpret_cast<const void*>(&cuptiSubscribe), SIMCUPTI_LIBRARY));
  ASSERT_TRUE(LoadedFrom(reinterpret_cast<const void*>(&cuInit), SIMCUDA_LIBRARY));
  ASSERT_CU(cuInit(0));
  CUdevice dev;
  ASSERT_CU(cuDeviceGet(&dev, 0));
  ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx_, dev));
  ASSERT_CU(cuCtxSetCurrent(ctx_));
  ASSERT_CU(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuMemAlloc_v2(&dev_, kDevBytes));
  simcuda_kernel_desc desc{};
  desc.name = kKernelName;
  desc.fn = StoreValue;
  desc.param_sizes = kParamSizes;
  desc.num_params = std::size(kParamSizes);
  desc.duration_ns = 5000;
  ASSERT_CU(simcuda_register_function(&desc, &kernel_));
}

void SimGpuTest::TearDown() {
  if (stream_ != nullptr) {
    EXPECT_CU(cuStreamSynchronize(stream_));
  }
}

CUresult SimGpuTest::Launch(CUdeviceptr out, uint32_t value, unsigned grid_x, unsigned block_x) {
  void* args[] = {&out, &value};
  return cuLaunchKernel(kernel_, grid_x, 3, 4, block_x, 1, 1, 0, stream_, args, nullptr);
}

void CUPTIAPI ApiLog::Callback(void* userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                               const void* cbdata) {
  auto* log = static_cast<ApiLog*>(userdata);
  const auto* d = static_cast<const CUpti_CallbackData*>(cbdata);
  ApiCall call{};
  call.domain = domain;
  call.cbid = cbid;
  call.site = d->callbackSite;
  call.function_name = d->functionName != nullptr ? d->functionName : "";
  call.has_symbol_name = d->symbolName != nullptr;
  call.context = d->context;
  call.context_uid = d->contextUid;
  call.correlation_id = d->correlationId;
  call.correlation_data = d->correlationData;
  if (d->callbackSite == CUPTI_API_ENTER) {
    if (d->correlationData != nullptr) *d->correlationData = Marker(d->correlationId);
  } else {
    if (d->correlationData != nullptr) call.data_at_exit = *d->correlationData;
    if (d->functionReturnValue != nullptr)
      call.result = *static_cast<const CUresult*>(d->functionReturnValue);
  }
  if (domain == CUPTI_CB_DOMAIN_DRIVER_API && d->functionParams != nullptr) {
    switch (cbid) {
      case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
        call.launch = *static_cast<const cuLaunchKernel_params*>(d->functionParams);
        break;
      case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2:
        call.h2d = *static_cast<const cuMemcpyHtoDAsync_v2_params*>(d->functionParams);
        break;
      case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async:
        call.memset = *static_cast<const cuMemsetD8Async_params*>(d->functionParams);
        break;
      default:
        break;
    }
  }
  std::lock_guard lock(log->mu_);
  log->calls_.push_back(std::move(call));
}

std::vector<ApiCall> ApiLog::calls() const {
  std::lock_guard lock(mu_);
  return calls_;
}

std::vector<ApiCall> ApiLog::calls(CUpti_CallbackId cbid) const {
  std::vector<ApiCall> out;
  for (ApiCall& c : calls())
    if (c.cbid == cbid) out.push_back(std::move(c));
  return out;
}

namespace collector {
namespace {

std::mutex g_mu;
Options g_options;
Stats g_stats;
std::vector<Record> g_records;

size_t SizeOf(CUpti_ActivityKind kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      return sizeof(CUpti_ActivityKernel10);
    case CUPTI_ACTIVITY_KIND_MEMCPY:
      return sizeof(CUpti_ActivityMemcpy6);
    case CUPTI_ACTIVITY_KIND_MEMSET:
      return sizeof(CUpti_ActivityMemset4);
    default:
      return 0;
  }
}

}  // namespace

void Configure(const Options& options) {
  std::lock_guard lock(g_mu);
  g_options = options;
}

void CUPTIAPI Request(uint8_t** buffer, size_t* size, size_t* max_records) {
  Options o;
  {
    std::lock_guard lock(g_mu);
    ++g_stats.requested;
    o = g_options;
  }
  if (o.no_buffer) {
    *buffer = nullptr;
    *size = 0;
    *max_records = 0;
    return;
  }
  // The misalignment is undone in Complete, which frees base - misalign.
  auto* base = static_cast<uint8_t*>(std::malloc(o.buffer_size + o.misalign));
  *buffer = base + o.misalign;
  *size = o.buffer_size;
  *max_records = o.max_records;
}

void CUPTIAPI Complete(CUcontext context, uint32_t stream_id, uint8_t* buffer, size_t size,
                       size_t valid_size) {
  int delay_ms;
  {
    std::lock_guard lock(g_mu);
    ++g_stats.entered_complete;
    delay_ms = g_options.complete_delay_ms;
  }
  if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  EXPECT_EQ(context, nullptr);  // "will always be NULL" since CUDA 6.0
  EXPECT_EQ(stream_id, 0u);
  EXPECT_LE(valid_size, size);
  std::vector<Record> records;
  CUpti_Activity* record = nullptr;
  CUptiResult status;
  while ((status = cuptiActivityGetNextRecord(buffer, valid_size, &record)) == CUPTI_SUCCESS) {
    const size_t n = SizeOf(record->kind);
    EXPECT_NE(n, 0u) << "unexpected kind " << record->kind;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(record) % ACTIVITY_RECORD_ALIGNMENT, 0u);
    const auto* p = reinterpret_cast<const uint8_t*>(record);
    records.push_back({record->kind, std::vector<uint8_t>(p, p + n)});
  }
  EXPECT_EQ(status, CUPTI_ERROR_MAX_LIMIT_REACHED);
  size_t misalign;
  {
    std::lock_guard lock(g_mu);
    ++g_stats.completed;
    if (valid_size == 0) ++g_stats.completed_empty;
    g_stats.valid_sizes.push_back(valid_size);
    g_records.insert(g_records.end(), records.begin(), records.end());
    misalign = g_options.misalign;
  }
  std::free(buffer - misalign);
}

Stats GetStats() {
  std::lock_guard lock(g_mu);
  return g_stats;
}

std::vector<Record> Records() {
  std::lock_guard lock(g_mu);
  return g_records;
}

std::vector<Record> Records(CUpti_ActivityKind kind) {
  std::vector<Record> out;
  for (Record& r : Records())
    if (r.kind == kind) out.push_back(std::move(r));
  return out;
}

}  // namespace collector
}  // namespace simcupti_test
