// Shared fixture and recorders for the simulated-CUPTI tests: a context and
// stream on the simulated GPU, one registered kernel, a log of API callbacks
// and a collector of activity records.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <cupti.h>
#include <gtest/gtest.h>
#include <simcuda.h>

#define ASSERT_CU(expr) ASSERT_EQ((expr), CUDA_SUCCESS) << #expr
#define EXPECT_CU(expr) EXPECT_EQ((expr), CUDA_SUCCESS) << #expr
#define ASSERT_CUPTI(expr) ASSERT_EQ((expr), CUPTI_SUCCESS) << #expr
#define EXPECT_CUPTI(expr) EXPECT_EQ((expr), CUPTI_SUCCESS) << #expr

namespace simcupti_test {

// Fails unless `symbol` was loaded from `expected_file` (compared after
// resolving symlinks): the real libcupti.so.13 is installed on this machine
// and must never stand in for the simulated one.
::testing::AssertionResult LoadedFrom(const void* symbol, const char* expected_file);

inline constexpr const char* kKernelName = "sim_cupti_test_kernel";

class SimGpuTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Launches the test kernel on stream_: it stores `value` at `out`.
  CUresult Launch(CUdeviceptr out, uint32_t value, unsigned grid_x = 2, unsigned block_x = 64);

  CUcontext ctx_ = nullptr;
  CUstream stream_ = nullptr;
  CUfunction kernel_ = nullptr;
  CUdeviceptr dev_ = 0;  // kDevBytes of device memory
  static constexpr size_t kDevBytes = 1 << 16;
};

// Driver API callbacks as seen by a subscriber. At enter the subscriber
// stores a marker in *correlationData and at exit reads it back.
struct ApiCall {
  CUpti_CallbackDomain domain;
  CUpti_CallbackId cbid;
  CUpti_ApiCallbackSite site;
  std::string function_name;
  bool has_symbol_name;
  CUcontext context;
  uint32_t context_uid;
  uint32_t correlation_id;
  uint64_t* correlation_data;
  uint64_t data_at_exit;  // *correlationData at exit
  CUresult result;        // *functionReturnValue at exit
  std::optional<cuLaunchKernel_params> launch;
  std::optional<cuMemcpyHtoDAsync_v2_params> h2d;
  std::optional<cuMemsetD8Async_params> memset;
};

inline uint64_t Marker(uint32_t correlation_id) {
  return 0x5eed'0000'0000ull | correlation_id;
}

class ApiLog {
 public:
  // A CUpti_CallbackFunc; userdata must be an ApiLog*.
  static void CUPTIAPI Callback(void* userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                const void* cbdata);
  std::vector<ApiCall> calls() const;
  std::vector<ApiCall> calls(CUpti_CallbackId cbid) const;

 private:
  mutable std::mutex mu_;
  std::vector<ApiCall> calls_;
};

// One activity record, copied out of the buffer it arrived in.
struct Record {
  CUpti_ActivityKind kind;
  std::vector<uint8_t> bytes;
  template <class T>
  T As() const {
    T out;
    EXPECT_GE(bytes.size(), sizeof(T));
    std::memcpy(&out, bytes.data(), std::min(bytes.size(), sizeof(T)));
    return out;
  }
};

// The activity buffer callbacks. Process-wide, as CUPTI's registration is.
namespace collector {

struct Options {
  size_t buffer_size = 64 * 1024;
  size_t max_records = 0;
  bool no_buffer = false;     // request callback declines
  size_t misalign = 0;        // hand out base + misalign
  int complete_delay_ms = 0;  // Complete sleeps this long before recording
};

void Configure(const Options& options);
void CUPTIAPI Request(uint8_t** buffer, size_t* size, size_t* max_records);
void CUPTIAPI Complete(CUcontext context, uint32_t stream_id, uint8_t* buffer, size_t size,
                       size_t valid_size);

struct Stats {
  size_t requested = 0;
  size_t entered_complete = 0;  // Complete calls started
  size_t completed = 0;         // Complete calls finished
  size_t completed_empty = 0;   // validSize 0
  std::vector<size_t> valid_sizes;
};
Stats GetStats();
std::vector<Record> Records();
std::vector<Record> Records(CUpti_ActivityKind kind);

}  // namespace collector

}  // namespace simcupti_test
