// The activity API (cupti_activity.h) against the simulated driver.
#include <algorithm>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

#include "sim_gpu.h"

namespace simcupti_test {
namespace {

class ActivityTest : public SimGpuTest {
 protected:
  void SetUp() override {
    SimGpuTest::SetUp();
    if (HasFatalFailure()) return;
    collector::Configure(options_);
  }

  void Register() {
    ASSERT_CUPTI(cuptiActivityRegisterCallbacks(collector::Request, collector::Complete));
  }

  void EnableAll() {
    ASSERT_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    ASSERT_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
    ASSERT_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
  }

  collector::Options options_;
};

// The correlation id the driver gave the one call of `cbid` in `log`.
uint32_t CorrelationOf(const ApiLog& log, CUpti_CallbackId cbid) {
  const auto calls = log.calls(cbid);
  EXPECT_EQ(calls.size(), 2u) << "callbacks for cbid " << cbid;
  return calls.empty() ? 0 : calls[0].correlation_id;
}

TEST_F(ActivityTest, KernelCopyAndSetRecordsArriveOnFlush) {
  ApiLog log;
  CUpti_SubscriberHandle s = nullptr;
  ASSERT_CUPTI(cuptiSubscribe(&s, ApiLog::Callback, &log));
  for (CUpti_CallbackId cbid :
       {CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2,
        CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async})
    ASSERT_CUPTI(cuptiEnableCallback(1, s, CUPTI_CB_DOMAIN_DRIVER_API, cbid));
  Register();
  EnableAll();

  std::vector<uint8_t> host(12345, 3);
  ASSERT_CU(cuMemcpyHtoDAsync_v2(dev_, host.data(), host.size(), stream_));
  ASSERT_CU(cuMemsetD8Async(dev_ + 16384, 0x5a, 4000, stream_));
  ASSERT_CU(Launch(dev_ + 32768, 99, /*grid_x=*/6, /*block_x=*/32));
  ASSERT_CU(cuStreamSynchronize(stream_));
  ASSERT_CUPTI(cuptiActivityFlushAll(0));

  uint32_t ctx_id = 0, stream_id = 0;
  ASSERT_CUPTI(cuptiGetContextId(ctx_, &ctx_id));
  ASSERT_CUPTI(cuptiGetStreamId(ctx_, stream_, &stream_id));
  uint32_t device_id = 99;
  ASSERT_CUPTI(cuptiGetDeviceId(ctx_, &device_id));

  const auto copies = collector::Records(CUPTI_ACTIVITY_KIND_MEMCPY);
  ASSERT_EQ(copies.size(), 1u);
  const auto copy = copies[0].As<CUpti_ActivityMemcpy6>();
  EXPECT_EQ(copy.bytes, host.size());
  EXPECT_EQ(copy.copyKind, CUPTI_ACTIVITY_MEMCPY_KIND_HTOD);
  EXPECT_EQ(copy.dstKind, CUPTI_ACTIVITY_MEMORY_KIND_DEVICE);
  EXPECT_EQ(copy.correlationId, CorrelationOf(log, CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2));
  EXPECT_LE(copy.start, copy.end);
  EXPECT_EQ(copy.contextId, ctx_id);
  EXPECT_EQ(copy.streamId, stream_id);
  EXPECT_EQ(copy.deviceId, device_id);

  const auto sets = collector::Records(CUPTI_ACTIVITY_KIND_MEMSET);
  ASSERT_EQ(sets.size(), 1u);
  const auto set = sets[0].As<CUpti_ActivityMemset4>();
  EXPECT_EQ(set.bytes, 4000u);
  EXPECT_EQ(set.value, 0x5au);
  EXPECT_EQ(set.correlationId, CorrelationOf(log, CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async));
  EXPECT_LE(set.start, set.end);
  EXPECT_EQ(set.streamId, stream_id);

  const auto kernels = collector::Records(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  ASSERT_EQ(kernels.size(), 1u);
  const auto k = kernels[0].As<CUpti_ActivityKernel10>();
  EXPECT_EQ(k.correlationId, CorrelationOf(log, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel));
  ASSERT_NE(k.name, nullptr);
  EXPECT_STREQ(k.name, kKernelName);
  EXPECT_EQ(k.gridX, 6);
  EXPECT_EQ(k.gridY, 3);
  EXPECT_EQ(k.gridZ, 4);
  EXPECT_EQ(k.blockX, 32);
  EXPECT_EQ(k.blockY, 1);
  EXPECT_LE(k.start, k.end);
  EXPECT_EQ(k.streamId, stream_id);
  EXPECT_EQ(k.contextId, ctx_id);

  // One stream runs its work in order.
  EXPECT_LE(copy.end, set.start);
  EXPECT_LE(set.end, k.start);
  // The host waited for all of it, so CUPTI's clock is past it.
  uint64_t now = 0;
  ASSERT_CUPTI(cuptiGetTimestamp(&now));
  EXPECT_GE(now, k.end);

  // The kernel's work happened.
  uint32_t stored = 0;
  std::memcpy(&stored, reinterpret_cast<const void*>(dev_ + 32768), sizeof stored);
  EXPECT_EQ(stored, 99u);
  EXPECT_CUPTI(cuptiUnsubscribe(s));
}

TEST_F(ActivityTest, KernelKindTakesPrecedenceWhenBothAreEnabled) {
  Register();
  ASSERT_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_KERNEL));
  ASSERT_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  ASSERT_CU(Launch(dev_, 1));
  ASSERT_CU(cuStreamSynchronize(stream_));
  ASSERT_CUPTI(cuptiActivityFlushAll(0));
  EXPECT_EQ(collector::Records(CUPTI_ACTIVITY_KIND_KERNEL).size(), 1u);
  EXPECT_EQ(collector::Records().size(), 1u);
}

TEST_F(ActivityTest, ForcedFlushDeliversAPartlyFilledBuffer) {
  Register();
  EnableAll();
  ASSERT_CU(cuMemsetD8Async(dev_, 1, 100, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_EQ(collector::GetStats().completed, 0u);  // not full: held until a flush
  ASSERT_CUPTI(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  const auto stats = collector::GetStats();
  ASSERT_EQ(stats.completed, 1u);
  EXPECT_EQ(stats.valid_sizes[0], sizeof(CUpti_ActivityMemset4));
  EXPECT_EQ(collector::Records(CUPTI_ACTIVITY_KIND_MEMSET).size(), 1u);
  // Nothing left: a second flush hands back nothing.
  ASSERT_CUPTI(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  EXPECT_EQ(collector::GetStats().completed, 1u);
}

TEST_F(ActivityTest, FullBuffersAreCompletedWithoutAFlush) {
  options_.max_records = 2;
  collector::Configure(options_);
  Register();
  EnableAll();
  for (int i = 0; i < 5; ++i) ASSERT_CU(cuMemsetD8Async(dev_ + i, 1, 1, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_EQ(collector::GetStats().completed, 2u);  // two full buffers of two
  EXPECT_EQ(collector::Records().size(), 4u);
  ASSERT_CUPTI(cuptiActivityFlushAll(0));
  EXPECT_EQ(collector::GetStats().completed, 3u);
  EXPECT_EQ(collector::Records().size(), 5u);
}

// cuptiActivityFlushAll "is a blocking call": when it returns, a buffer that
// another thread is still handing back must have arrived too.
TEST_F(ActivityTest, FlushWaitsForABufferBeingDeliveredElsewhere) {
  options_.max_records = 1;  // the record completes its buffer on the worker
  options_.complete_delay_ms = 300;
  collector::Configure(options_);
  Register();
  EnableAll();
  ASSERT_CU(cuMemsetD8Async(dev_, 1, 8, stream_));
  // No synchronize: wait only until the worker is inside the complete callback.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (collector::GetStats().entered_complete == 0) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no buffer was completed";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_CUPTI(cuptiActivityFlushAll(0));
  EXPECT_EQ(collector::GetStats().completed, 1u);
  EXPECT_EQ(collector::Records(CUPTI_ACTIVITY_KIND_MEMSET).size(), 1u);
}

TEST_F(ActivityTest, RecordsAreAlignedInAMisalignedBuffer) {
  options_.misalign = 3;
  options_.buffer_size = 4096;
  collector::Configure(options_);
  Register();
  EnableAll();
  ASSERT_CU(cuMemsetD8Async(dev_, 1, 1, stream_));
  ASSERT_CU(Launch(dev_, 1));
  ASSERT_CU(cuStreamSynchronize(stream_));
  ASSERT_CUPTI(cuptiActivityFlushAll(0));
  // The collector checks each record's alignment as it iterates.
  EXPECT_EQ(collector::Records().size(), 2u);
}

TEST_F(ActivityTest, RecordsAreDroppedAndCountedWithoutABuffer) {
  options_.no_buffer = true;
  collector::Configure(options_);
  Register();
  EnableAll();
  for (int i = 0; i < 3; ++i) ASSERT_CU(cuMemsetD8Async(dev_, 1, 64, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  ASSERT_CUPTI(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  EXPECT_GE(collector::GetStats().requested, 1u);
  EXPECT_EQ(collector::GetStats().completed, 0u);
  size_t dropped = 0;
  ASSERT_CUPTI(cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped));
  EXPECT_EQ(dropped, 3u);
  ASSERT_CUPTI(cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped));
  EXPECT_EQ(dropped, 0u);  // reading resets the count
  EXPECT_EQ(cuptiActivityGetNumDroppedRecords(nullptr, 0, nullptr), CUPTI_ERROR_INVALID_PARAMETER);
}

TEST_F(ActivityTest, ATooSmallBufferIsReturnedEmptyAndTheRecordDropped) {
  options_.buffer_size = 64;  // smaller than any record
  collector::Configure(options_);
  Register();
  EnableAll();
  ASSERT_CU(cuMemsetD8Async(dev_, 1, 64, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  ASSERT_CUPTI(cuptiActivityFlushAll(0));
  const auto stats = collector::GetStats();
  EXPECT_EQ(stats.completed, 1u);
  EXPECT_EQ(stats.completed_empty, 1u);
  size_t dropped = 0;
  ASSERT_CUPTI(cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped));
  EXPECT_EQ(dropped, 1u);
}

TEST_F(ActivityTest, DisabledKindsProduceNothing) {
  Register();
  ASSERT_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
  ASSERT_CUPTI(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMSET));
  std::vector<uint8_t> host(64);
  ASSERT_CU(cuMemsetD8Async(dev_, 1, 64, stream_));
  ASSERT_CU(cuMemcpyHtoDAsync_v2(dev_, host.data(), host.size(), stream_));
  ASSERT_CU(Launch(dev_, 1));
  ASSERT_CU(cuStreamSynchronize(stream_));
  ASSERT_CUPTI(cuptiActivityFlushAll(0));
  EXPECT_TRUE(collector::Records().empty());
  size_t dropped = 1;
  ASSERT_CUPTI(cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped));
  EXPECT_EQ(dropped, 0u);
}

TEST_F(ActivityTest, UnmodelledAndInvalidKindsAreRefused) {
  EXPECT_EQ(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER),
            CUPTI_ERROR_NOT_COMPATIBLE);
  EXPECT_EQ(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER), CUPTI_ERROR_NOT_COMPATIBLE);
  EXPECT_EQ(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_INVALID), CUPTI_ERROR_INVALID_KIND);
  EXPECT_EQ(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_COUNT), CUPTI_ERROR_INVALID_KIND);
  EXPECT_EQ(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_COUNT), CUPTI_ERROR_INVALID_KIND);
  EXPECT_EQ(cuptiGetLastError(), CUPTI_ERROR_INVALID_KIND);
}

TEST_F(ActivityTest, FlushNeedsRegisteredCallbacks) {
  EXPECT_EQ(cuptiActivityFlushAll(0), CUPTI_ERROR_INVALID_OPERATION);
  EXPECT_EQ(cuptiActivityRegisterCallbacks(nullptr, collector::Complete),
            CUPTI_ERROR_INVALID_PARAMETER);
  EXPECT_EQ(cuptiActivityRegisterCallbacks(collector::Request, nullptr),
            CUPTI_ERROR_INVALID_PARAMETER);
  Register();
  EXPECT_CUPTI(cuptiActivityFlushAll(0));
  EXPECT_CUPTI(cuptiActivityFlush(nullptr, 0, 0));
}

TEST_F(ActivityTest, ManyStreamsAndThreadsLoseNothing) {
  options_.max_records = 3;  // many buffers, completed from several workers
  collector::Configure(options_);
  Register();
  EnableAll();
  constexpr int kThreads = 4;
  constexpr int kOpsPerThread = 50;
  std::vector<std::thread> threads;
  std::vector<CUstream> streams(kThreads);
  for (CUstream& s : streams) ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      EXPECT_CU(cuCtxSetCurrent(ctx_));
      for (int i = 0; i < kOpsPerThread; ++i) {
        EXPECT_CU(cuMemsetD8Async(dev_ + t * 1024, static_cast<unsigned char>(i), 16, streams[t]));
        if (i % 10 == 0) {
          EXPECT_CUPTI(cuptiActivityFlushAll(0));
        }
      }
      EXPECT_CU(cuStreamSynchronize(streams[t]));
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_CUPTI(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  const auto records = collector::Records(CUPTI_ACTIVITY_KIND_MEMSET);
  EXPECT_EQ(records.size(), size_t{kThreads} * kOpsPerThread);
  std::set<uint32_t> correlation_ids;
  for (const Record& r : records)
    correlation_ids.insert(r.As<CUpti_ActivityMemset4>().correlationId);
  EXPECT_EQ(correlation_ids.size(), records.size());
  size_t dropped = 1;
  ASSERT_CUPTI(cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped));
  EXPECT_EQ(dropped, 0u);
}

TEST_F(ActivityTest, FinalizeHandsBackHeldBuffersAndResets) {
  Register();
  EnableAll();
  ASSERT_CU(cuMemsetD8Async(dev_, 1, 8, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  ASSERT_CUPTI(cuptiFinalize());
  EXPECT_EQ(collector::GetStats().completed, 1u);
  EXPECT_EQ(collector::Records().size(), 1u);
  // Collection is off and the callbacks are forgotten.
  ASSERT_CU(cuMemsetD8Async(dev_, 1, 8, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_EQ(cuptiActivityFlushAll(0), CUPTI_ERROR_INVALID_OPERATION);
  Register();
  ASSERT_CUPTI(cuptiActivityFlushAll(0));
  EXPECT_EQ(collector::Records().size(), 1u);
}

TEST_F(ActivityTest, IdsAndTimestamps) {
  uint32_t id = 0;
  EXPECT_EQ(cuptiGetContextId(nullptr, &id), CUPTI_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuptiGetContextId(ctx_, nullptr), CUPTI_ERROR_INVALID_PARAMETER);
  ASSERT_CUPTI(cuptiGetContextId(ctx_, &id));
  EXPECT_NE(id, 0u);
  uint32_t a = 0, b = 0;
  CUstream other = nullptr;
  ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  ASSERT_CUPTI(cuptiGetStreamId(ctx_, stream_, &a));
  ASSERT_CUPTI(cuptiGetStreamId(ctx_, other, &b));
  EXPECT_NE(a, b);
  EXPECT_EQ(cuptiGetStreamId(ctx_, stream_, nullptr), CUPTI_ERROR_INVALID_PARAMETER);
  uint64_t t0 = 0, t1 = 0;
  ASSERT_CUPTI(cuptiGetTimestamp(&t0));
  ASSERT_CU(Launch(dev_, 1));
  ASSERT_CU(cuStreamSynchronize(stream_));
  ASSERT_CUPTI(cuptiGetTimestamp(&t1));
  EXPECT_GT(t1, t0);  // the host waited for a 5 us kernel
  EXPECT_EQ(cuptiGetTimestamp(nullptr), CUPTI_ERROR_INVALID_PARAMETER);
}

// cupti_activity.h, cuptiGetStreamId: the context "Typically ... should be
// null"; the stream alone identifies itself.
TEST_F(ActivityTest, StreamIdWithoutAContext) {
  uint32_t with_ctx = 0, without = 0;
  ASSERT_CUPTI(cuptiGetStreamId(ctx_, stream_, &with_ctx));
  ASSERT_CUPTI(cuptiGetStreamId(nullptr, stream_, &without));
  EXPECT_EQ(with_ctx, without);
}

}  // namespace
}  // namespace simcupti_test
