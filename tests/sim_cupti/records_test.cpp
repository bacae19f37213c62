// The parts of CUPTI that need no device: record iteration, result strings
// and callback names.
#include <cstring>
#include <string>
#include <vector>

#include "sim_gpu.h"

namespace simcupti_test {
namespace {

class BufferBuilder {
 public:
  template <class T>
  void Add(const T& record) {
    const size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    std::memcpy(bytes_.data() + at, &record, sizeof(T));
  }
  void AddRaw(std::initializer_list<uint8_t> raw) { bytes_.insert(bytes_.end(), raw); }
  uint8_t* data() { return bytes_.data(); }
  size_t size() const { return bytes_.size(); }

 private:
  // operator new's alignment (16) covers the records' 8.
  std::vector<uint8_t> bytes_;
};

CUpti_ActivityMemset4 MemsetRecord(uint32_t correlation_id) {
  CUpti_ActivityMemset4 r{};
  r.kind = CUPTI_ACTIVITY_KIND_MEMSET;
  r.correlationId = correlation_id;
  return r;
}

CUpti_ActivityMemcpy6 MemcpyRecord(uint32_t correlation_id) {
  CUpti_ActivityMemcpy6 r{};
  r.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
  r.correlationId = correlation_id;
  return r;
}

TEST(NextRecord, IteratesToTheEnd) {
  BufferBuilder b;
  b.Add(MemsetRecord(1));
  b.Add(MemcpyRecord(2));
  CUpti_ActivityKernel10 k{};
  k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  k.correlationId = 3;
  b.Add(k);

  CUpti_Activity* r = nullptr;
  ASSERT_CUPTI(cuptiActivityGetNextRecord(b.data(), b.size(), &r));
  EXPECT_EQ(r->kind, CUPTI_ACTIVITY_KIND_MEMSET);
  EXPECT_EQ(reinterpret_cast<CUpti_ActivityMemset4*>(r)->correlationId, 1u);
  ASSERT_CUPTI(cuptiActivityGetNextRecord(b.data(), b.size(), &r));
  EXPECT_EQ(r->kind, CUPTI_ACTIVITY_KIND_MEMCPY);
  EXPECT_EQ(reinterpret_cast<CUpti_ActivityMemcpy6*>(r)->correlationId, 2u);
  ASSERT_CUPTI(cuptiActivityGetNextRecord(b.data(), b.size(), &r));
  EXPECT_EQ(r->kind, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  EXPECT_EQ(reinterpret_cast<CUpti_ActivityKernel10*>(r)->correlationId, 3u);
  EXPECT_EQ(cuptiActivityGetNextRecord(b.data(), b.size(), &r), CUPTI_ERROR_MAX_LIMIT_REACHED);
}

TEST(NextRecord, EmptyBufferHasNoRecords) {
  uint64_t storage = 0;
  CUpti_Activity* r = nullptr;
  EXPECT_EQ(cuptiActivityGetNextRecord(reinterpret_cast<uint8_t*>(&storage), 0, &r),
            CUPTI_ERROR_MAX_LIMIT_REACHED);
  EXPECT_EQ(r, nullptr);
}

TEST(NextRecord, GarbageIsAnInvalidKind) {
  BufferBuilder b;
  b.Add(MemsetRecord(1));
  b.AddRaw({0xff, 0xff, 0x00, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  CUpti_Activity* r = nullptr;
  ASSERT_CUPTI(cuptiActivityGetNextRecord(b.data(), b.size(), &r));
  EXPECT_EQ(cuptiActivityGetNextRecord(b.data(), b.size(), &r), CUPTI_ERROR_INVALID_KIND);
}

TEST(NextRecord, ATruncatedRecordIsAnInvalidKind) {
  BufferBuilder b;
  b.Add(MemsetRecord(1));
  b.Add(MemcpyRecord(2));
  CUpti_Activity* r = nullptr;
  const size_t valid = b.size() - 8;  // the memcpy record is cut short
  ASSERT_CUPTI(cuptiActivityGetNextRecord(b.data(), valid, &r));
  EXPECT_EQ(cuptiActivityGetNextRecord(b.data(), valid, &r), CUPTI_ERROR_INVALID_KIND);
}

TEST(NextRecord, NullArgumentsAreInvalid) {
  uint64_t storage = 0;
  CUpti_Activity* r = nullptr;
  EXPECT_EQ(cuptiActivityGetNextRecord(nullptr, 8, &r), CUPTI_ERROR_INVALID_PARAMETER);
  EXPECT_EQ(cuptiActivityGetNextRecord(reinterpret_cast<uint8_t*>(&storage), 8, nullptr),
            CUPTI_ERROR_INVALID_PARAMETER);
}

TEST(ResultString, NamesTheResult) {
  const char* s = nullptr;
  ASSERT_CUPTI(cuptiGetResultString(CUPTI_SUCCESS, &s));
  EXPECT_STREQ(s, "CUPTI_SUCCESS");
  ASSERT_CUPTI(cuptiGetResultString(CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED, &s));
  EXPECT_STREQ(s, "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED");
  ASSERT_CUPTI(cuptiGetResultString(CUPTI_ERROR_UNKNOWN, &s));
  EXPECT_STREQ(s, "CUPTI_ERROR_UNKNOWN");
  EXPECT_EQ(cuptiGetResultString(static_cast<CUptiResult>(12345), &s),
            CUPTI_ERROR_INVALID_PARAMETER);
  EXPECT_EQ(cuptiGetResultString(CUPTI_SUCCESS, nullptr), CUPTI_ERROR_INVALID_PARAMETER);
}

TEST(ResultString, EveryResultThisLibraryReturnsHasAName) {
  for (CUptiResult r :
       {CUPTI_SUCCESS, CUPTI_ERROR_INVALID_PARAMETER, CUPTI_ERROR_INVALID_CONTEXT,
        CUPTI_ERROR_INVALID_OPERATION, CUPTI_ERROR_MAX_LIMIT_REACHED, CUPTI_ERROR_NOT_COMPATIBLE,
        CUPTI_ERROR_NOT_INITIALIZED, CUPTI_ERROR_INVALID_STREAM, CUPTI_ERROR_INVALID_KIND,
        CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED}) {
    const char* s = nullptr;
    ASSERT_CUPTI(cuptiGetResultString(r, &s)) << "result " << r;
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(std::string(s).rfind("CUPTI_", 0), 0u) << s;
  }
}

TEST(CallbackName, DriverAndRuntimeNames) {
  const char* name = nullptr;
  ASSERT_CUPTI(cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API,
                                    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, &name));
  EXPECT_STREQ(name, "cuLaunchKernel");
  ASSERT_CUPTI(cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API,
                                    CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2_ptsz, &name));
  EXPECT_STREQ(name, "cuMemcpyHtoDAsync_v2_ptsz");
  ASSERT_CUPTI(cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API,
                                    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000, &name));
  EXPECT_STREQ(name, "cudaLaunchKernel_v7000");
}

TEST(CallbackName, UnknownIdsAndOtherDomainsAreInvalid) {
  const char* name = nullptr;
  EXPECT_EQ(cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_SIZE, &name),
            CUPTI_ERROR_INVALID_PARAMETER);
  EXPECT_EQ(cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, 0, &name),
            CUPTI_ERROR_INVALID_PARAMETER);
  EXPECT_EQ(cuptiGetCallbackName(CUPTI_CB_DOMAIN_RESOURCE, 1, &name),
            CUPTI_ERROR_INVALID_PARAMETER);
  EXPECT_EQ(cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, 1, nullptr),
            CUPTI_ERROR_INVALID_PARAMETER);
}

}  // namespace
}  // namespace simcupti_test
