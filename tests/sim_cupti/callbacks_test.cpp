// The callback API (cupti_callbacks.h) against the simulated driver.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "sim_gpu.h"

namespace simcupti_test {
namespace {

class CallbackTest : public SimGpuTest {
 protected:
  void TearDown() override {
    SimGpuTest::TearDown();
    if (subscriber_ != nullptr) {
      EXPECT_CUPTI(cuptiUnsubscribe(subscriber_));
    }
  }

  void Subscribe() { ASSERT_CUPTI(cuptiSubscribe(&subscriber_, ApiLog::Callback, &log_)); }

  void EnableDriver(CUpti_CallbackId cbid) {
    ASSERT_CUPTI(cuptiEnableCallback(1, subscriber_, CUPTI_CB_DOMAIN_DRIVER_API, cbid));
  }

  ApiLog log_;
  CUpti_SubscriberHandle subscriber_ = nullptr;
};

void CUPTIAPI Ignore(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void*) {}

TEST_F(CallbackTest, SecondSubscriberIsRefusedUntilTheFirstUnsubscribes) {
  CUpti_SubscriberParams first_params{};
  first_params.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
  first_params.subscriberName = "spillway";
  CUpti_SubscriberHandle first = nullptr;
  ASSERT_CUPTI(cuptiSubscribe_v2(&first, Ignore, nullptr, &first_params));

  CUpti_SubscriberHandle second = nullptr;
  EXPECT_EQ(cuptiSubscribe(&second, Ignore, nullptr),
            CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED);
  EXPECT_EQ(cuptiGetLastError(), CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED);
  EXPECT_EQ(cuptiGetLastError(), CUPTI_SUCCESS);  // reading resets it

  // cuptiSubscribe_v2 names the subscriber in the way.
  char old_name[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN] = {};
  CUpti_SubscriberParams second_params{};
  second_params.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
  second_params.oldSubscriberName = old_name;
  second_params.oldSubscriberSize = sizeof old_name;
  EXPECT_EQ(cuptiSubscribe_v2(&second, Ignore, nullptr, &second_params),
            CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED);
  EXPECT_STREQ(old_name, "CUPTI for spillway");

  ASSERT_CUPTI(cuptiUnsubscribe(first));
  EXPECT_EQ(cuptiUnsubscribe(first), CUPTI_ERROR_INVALID_PARAMETER);  // already gone
  ASSERT_CUPTI(cuptiSubscribe(&second, Ignore, nullptr));
  EXPECT_CUPTI(cuptiUnsubscribe(second));
}

TEST_F(CallbackTest, SubscribeRejectsBadArguments) {
  EXPECT_EQ(cuptiSubscribe(nullptr, Ignore, nullptr), CUPTI_ERROR_INVALID_PARAMETER);
  CUpti_SubscriberParams params{};  // structSize not filled in
  CUpti_SubscriberHandle s = nullptr;
  EXPECT_EQ(cuptiSubscribe_v2(&s, Ignore, nullptr, &params), CUPTI_ERROR_INVALID_PARAMETER);
  // Neither failure left a subscriber behind.
  ASSERT_CUPTI(cuptiSubscribe(&s, Ignore, nullptr));
  EXPECT_CUPTI(cuptiUnsubscribe(s));
}

TEST_F(CallbackTest, OnlyEnabledCallbacksAreDelivered) {
  Subscribe();
  EnableDriver(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel);
  uint32_t state = 0;
  ASSERT_CUPTI(cuptiGetCallbackState(&state, subscriber_, CUPTI_CB_DOMAIN_DRIVER_API,
                                     CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel));
  EXPECT_EQ(state, 1u);
  ASSERT_CUPTI(cuptiGetCallbackState(&state, subscriber_, CUPTI_CB_DOMAIN_DRIVER_API,
                                     CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2));
  EXPECT_EQ(state, 0u);

  std::vector<uint8_t> host(4096, 7);
  ASSERT_CU(cuMemcpyHtoDAsync_v2(dev_, host.data(), host.size(), stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_TRUE(log_.calls().empty()) << "first: " << log_.calls().front().function_name;

  ASSERT_CU(Launch(dev_, 1));
  ASSERT_CU(cuStreamSynchronize(stream_));
  const auto calls = log_.calls();
  ASSERT_EQ(calls.size(), 2u);
  for (const ApiCall& c : calls) {
    EXPECT_EQ(c.domain, CUPTI_CB_DOMAIN_DRIVER_API);
    EXPECT_EQ(c.cbid, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel);
  }

  // Disabled again: nothing more arrives.
  ASSERT_CUPTI(cuptiEnableCallback(0, subscriber_, CUPTI_CB_DOMAIN_DRIVER_API,
                                   CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel));
  ASSERT_CU(Launch(dev_, 2));
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_EQ(log_.calls().size(), 2u);
}

TEST_F(CallbackTest, EnterAndExitShareCorrelationAndSeeTheRealArguments) {
  Subscribe();
  EnableDriver(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel);
  ASSERT_CU(Launch(dev_ + 256, 42, /*grid_x=*/5, /*block_x=*/128));
  ASSERT_CU(cuStreamSynchronize(stream_));

  const auto calls = log_.calls(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel);
  ASSERT_EQ(calls.size(), 2u);
  const ApiCall& enter = calls[0];
  const ApiCall& exit = calls[1];
  EXPECT_EQ(enter.site, CUPTI_API_ENTER);
  EXPECT_EQ(exit.site, CUPTI_API_EXIT);
  EXPECT_NE(enter.correlation_id, 0u);
  EXPECT_EQ(enter.correlation_id, exit.correlation_id);
  ASSERT_NE(enter.correlation_data, nullptr);
  EXPECT_EQ(enter.correlation_data, exit.correlation_data);
  EXPECT_EQ(exit.data_at_exit, Marker(enter.correlation_id));
  EXPECT_EQ(exit.result, CUDA_SUCCESS);
  EXPECT_EQ(enter.function_name, "cuLaunchKernel");
  EXPECT_EQ(enter.context, ctx_);
  uint32_t ctx_id = 0;
  ASSERT_CUPTI(cuptiGetContextId(ctx_, &ctx_id));
  EXPECT_EQ(enter.context_uid, ctx_id);

  for (const ApiCall* c : {&enter, &exit}) {
    ASSERT_TRUE(c->launch.has_value());
    const cuLaunchKernel_params& p = *c->launch;
    EXPECT_EQ(p.f, kernel_);
    EXPECT_EQ(p.hStream, stream_);
    EXPECT_EQ(p.gridDimX, 5u);
    EXPECT_EQ(p.gridDimY, 3u);
    EXPECT_EQ(p.gridDimZ, 4u);
    EXPECT_EQ(p.blockDimX, 128u);
    EXPECT_EQ(p.sharedMemBytes, 0u);
    ASSERT_NE(p.kernelParams, nullptr);
    // kernelParams is only valid during the callback; its address is not
    // dereferenced here.
  }

  // Another call gets a fresh correlation id.
  ASSERT_CU(Launch(dev_, 43));
  ASSERT_CU(cuStreamSynchronize(stream_));
  const auto more = log_.calls(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel);
  ASSERT_EQ(more.size(), 4u);
  EXPECT_NE(more[2].correlation_id, enter.correlation_id);
}

TEST_F(CallbackTest, CopyAndSetParamsDecode) {
  Subscribe();
  ASSERT_CUPTI(cuptiEnableDomain(1, subscriber_, CUPTI_CB_DOMAIN_DRIVER_API));
  std::vector<uint8_t> host(3000, 9);
  ASSERT_CU(cuMemcpyHtoDAsync_v2(dev_ + 64, host.data(), host.size(), stream_));
  ASSERT_CU(cuMemsetD8Async(dev_ + 8192, 0xab, 777, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));

  const auto copies = log_.calls(CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2);
  ASSERT_EQ(copies.size(), 2u);
  ASSERT_TRUE(copies[0].h2d.has_value());
  EXPECT_EQ(copies[0].function_name, "cuMemcpyHtoDAsync_v2");
  EXPECT_EQ(copies[0].h2d->dstDevice, dev_ + 64);
  EXPECT_EQ(copies[0].h2d->srcHost, host.data());
  EXPECT_EQ(copies[0].h2d->ByteCount, host.size());
  EXPECT_EQ(copies[0].h2d->hStream, stream_);

  const auto sets = log_.calls(CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async);
  ASSERT_EQ(sets.size(), 2u);
  ASSERT_TRUE(sets[1].memset.has_value());
  EXPECT_EQ(sets[1].memset->dstDevice, dev_ + 8192);
  EXPECT_EQ(sets[1].memset->uc, 0xab);
  EXPECT_EQ(sets[1].memset->N, 777u);
  EXPECT_EQ(sets[1].memset->hStream, stream_);

  // The whole domain includes the synchronize.
  EXPECT_EQ(log_.calls(CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize).size(), 2u);
  EXPECT_CUPTI(cuptiEnableDomain(0, subscriber_, CUPTI_CB_DOMAIN_DRIVER_API));
  const size_t before = log_.calls().size();
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_EQ(log_.calls().size(), before);
}

TEST_F(CallbackTest, InvalidDomainsAndIdsAreRejected) {
  Subscribe();
  const auto driver = CUPTI_CB_DOMAIN_DRIVER_API;
  EXPECT_EQ(cuptiEnableCallback(1, subscriber_, CUPTI_CB_DOMAIN_INVALID, 1),
            CUPTI_ERROR_INVALID_PARAMETER);
  EXPECT_EQ(cuptiEnableCallback(1, subscriber_, static_cast<CUpti_CallbackDomain>(99), 1),
            CUPTI_ERROR_INVALID_PARAMETER);
  EXPECT_EQ(cuptiEnableCallback(1, subscriber_, driver, CUPTI_DRIVER_TRACE_CBID_INVALID),
            CUPTI_ERROR_INVALID_PARAMETER);
  EXPECT_EQ(cuptiEnableCallback(1, subscriber_, driver, CUPTI_DRIVER_TRACE_CBID_SIZE),
            CUPTI_ERROR_INVALID_PARAMETER);
  EXPECT_EQ(cuptiEnableCallback(1, subscriber_, CUPTI_CB_DOMAIN_RUNTIME_API,
                                CUPTI_RUNTIME_TRACE_CBID_SIZE),
            CUPTI_ERROR_INVALID_PARAMETER);
  EXPECT_EQ(cuptiEnableDomain(1, subscriber_, CUPTI_CB_DOMAIN_INVALID),
            CUPTI_ERROR_INVALID_PARAMETER);
  uint32_t state = 7;
  EXPECT_EQ(cuptiGetCallbackState(nullptr, subscriber_, driver, 1), CUPTI_ERROR_INVALID_PARAMETER);
  EXPECT_EQ(cuptiGetCallbackState(&state, subscriber_, driver, CUPTI_DRIVER_TRACE_CBID_SIZE),
            CUPTI_ERROR_INVALID_PARAMETER);
  EXPECT_EQ(cuptiGetLastError(), CUPTI_ERROR_INVALID_PARAMETER);

  // A handle that is no longer subscribed is invalid.
  ASSERT_CUPTI(cuptiUnsubscribe(subscriber_));
  CUpti_SubscriberHandle stale = subscriber_;
  subscriber_ = nullptr;
  EXPECT_EQ(cuptiEnableCallback(1, stale, driver, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel),
            CUPTI_ERROR_INVALID_PARAMETER);
  EXPECT_EQ(cuptiEnableAllDomains(1, stale), CUPTI_ERROR_INVALID_PARAMETER);
  EXPECT_EQ(cuptiEnableAllDomains(1, nullptr), CUPTI_ERROR_INVALID_PARAMETER);
}

TEST_F(CallbackTest, RuntimeDomainCanBeEnabledButNeverFires) {
  Subscribe();
  ASSERT_CUPTI(cuptiEnableCallback(1, subscriber_, CUPTI_CB_DOMAIN_RUNTIME_API,
                                   CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000));
  uint32_t state = 0;
  ASSERT_CUPTI(cuptiGetCallbackState(&state, subscriber_, CUPTI_CB_DOMAIN_RUNTIME_API,
                                     CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000));
  EXPECT_EQ(state, 1u);
  ASSERT_CU(Launch(dev_, 1));
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_TRUE(log_.calls().empty());
}

TEST_F(CallbackTest, EnableAllDomainsDeliversDriverCallbacksOnly) {
  Subscribe();
  ASSERT_CUPTI(cuptiEnableAllDomains(1, subscriber_));
  ASSERT_CU(Launch(dev_, 1));
  ASSERT_CU(cuStreamSynchronize(stream_));
  const auto calls = log_.calls();
  ASSERT_FALSE(calls.empty());
  for (const ApiCall& c : calls) EXPECT_EQ(c.domain, CUPTI_CB_DOMAIN_DRIVER_API);
  EXPECT_EQ(log_.calls(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel).size(), 2u);
}

TEST_F(CallbackTest, SupportedDomainsListsTheHeaderDomains) {
  size_t count = 0;
  CUpti_DomainTable table = nullptr;
  ASSERT_CUPTI(cuptiSupportedDomains(&count, &table));
  ASSERT_NE(table, nullptr);
  std::vector<CUpti_CallbackDomain> domains(table, table + count);
  EXPECT_EQ(domains.size(), size_t{CUPTI_CB_DOMAIN_SIZE} - 1);
  EXPECT_NE(std::find(domains.begin(), domains.end(), CUPTI_CB_DOMAIN_DRIVER_API), domains.end());
  EXPECT_EQ(std::find(domains.begin(), domains.end(), CUPTI_CB_DOMAIN_INVALID), domains.end());
  EXPECT_EQ(cuptiSupportedDomains(nullptr, &table), CUPTI_ERROR_INVALID_PARAMETER);
}

TEST_F(CallbackTest, FinalizeInsideAnExitCallbackDetachesTheSubscriber) {
  // cupti_activity.h's cuptiFinalize example: detach from the exit callsite.
  struct Detacher {
    int calls = 0;
    static void CUPTIAPI Callback(void* userdata, CUpti_CallbackDomain, CUpti_CallbackId,
                                  const void* cbdata) {
      auto* self = static_cast<Detacher*>(userdata);
      ++self->calls;
      if (static_cast<const CUpti_CallbackData*>(cbdata)->callbackSite == CUPTI_API_EXIT) {
        EXPECT_CUPTI(cuptiFinalize());
      }
    }
  } detacher;
  CUpti_SubscriberHandle s = nullptr;
  ASSERT_CUPTI(cuptiSubscribe(&s, Detacher::Callback, &detacher));
  ASSERT_CUPTI(cuptiEnableCallback(1, s, CUPTI_CB_DOMAIN_DRIVER_API,
                                   CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel));
  ASSERT_CU(Launch(dev_, 1));
  ASSERT_CU(Launch(dev_, 2));
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_EQ(detacher.calls, 2);  // enter and exit of the first launch only
  // Detached: the old handle is gone and a new subscriber is welcome.
  EXPECT_EQ(cuptiUnsubscribe(s), CUPTI_ERROR_INVALID_PARAMETER);
  Subscribe();
}

}  // namespace
}  // namespace simcupti_test
