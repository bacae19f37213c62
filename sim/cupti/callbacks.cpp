#include "callbacks.h"

#include <array>
#include <atomic>
#include <cstdio>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "driver.h"
#include "errors.h"
#include "faults.h"
#include "names.h"

// The type behind CUpti_SubscriberHandle. Subscribers are never freed: a
// driver call on another thread may still be inside the callback of one that
// has just unsubscribed, and a stale handle must stay safe to reject.
struct CUpti_Subscriber_st {
  CUpti_CallbackFunc callback;
  void* userdata;
  std::string name;  // cuptiSubscribe_v2's subscriberName, "" if none
  std::unique_ptr<std::atomic<bool>[]> enabled[CUPTI_CB_DOMAIN_SIZE];
};

namespace simcupti {
namespace {

constinit std::mutex g_subscribe_mu;
std::atomic<CUpti_Subscriber_st*> g_current{nullptr};
// Every subscriber that has unsubscribed (see CUpti_Subscriber_st).
auto* const g_retired = new std::vector<CUpti_Subscriber_st*>;

// Caller holds g_subscribe_mu.
void retire_current() {
  if (CUpti_Subscriber_st* s = g_current.exchange(nullptr, std::memory_order_acq_rel))
    g_retired->push_back(s);
}

constexpr CUpti_CallbackDomain kDomains[] = {
    CUPTI_CB_DOMAIN_DRIVER_API,  CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_CB_DOMAIN_RESOURCE,
    CUPTI_CB_DOMAIN_SYNCHRONIZE, CUPTI_CB_DOMAIN_NVTX,        CUPTI_CB_DOMAIN_STATE,
};

// One past the largest callback id of `domain`, 0 for an invalid domain.
uint32_t domain_size(CUpti_CallbackDomain domain) {
  switch (domain) {
    case CUPTI_CB_DOMAIN_DRIVER_API:
      return CUPTI_DRIVER_TRACE_CBID_SIZE;
    case CUPTI_CB_DOMAIN_RUNTIME_API:
      return CUPTI_RUNTIME_TRACE_CBID_SIZE;
    case CUPTI_CB_DOMAIN_RESOURCE:
      return CUPTI_CBID_RESOURCE_SIZE;
    case CUPTI_CB_DOMAIN_SYNCHRONIZE:
      return CUPTI_CBID_SYNCHRONIZE_SIZE;
    case CUPTI_CB_DOMAIN_NVTX:
      return CUPTI_CBID_NVTX_SIZE;
    case CUPTI_CB_DOMAIN_STATE:
      return CUPTI_CBID_STATE_SIZE;
    default:
      return 0;
  }
}

// Callback id 0 is each domain's *_INVALID.
bool valid_cbid(CUpti_CallbackDomain domain, uint32_t cbid) {
  return cbid > 0 && cbid < domain_size(domain);
}

// The header leaves concurrent enable/query calls on one subscriber to the
// client to serialize; only the identity check needs to be atomic.
bool is_current(CUpti_SubscriberHandle s) {
  return s != nullptr && s == g_current.load(std::memory_order_acquire);
}

void set_domain(CUpti_SubscriberHandle s, CUpti_CallbackDomain domain, bool on) {
  for (uint32_t cbid = 1; cbid < domain_size(domain); ++cbid)
    s->enabled[domain][cbid].store(on, std::memory_order_relaxed);
}

// The name reported to a refused subscriber: "CUPTI for <subscriberName>", as
// cupti_callbacks.h describes the prefix, or "CUPTI" when none was given.
void describe(const CUpti_Subscriber_st& s, char* out, size_t size) {
  if (out == nullptr || size == 0) return;
  if (s.name.empty())
    std::snprintf(out, size, "CUPTI");
  else
    std::snprintf(out, size, "CUPTI for %s", s.name.c_str());
}

CUptiResult subscribe(CUpti_SubscriberHandle* subscriber, CUpti_CallbackFunc callback,
                      void* userdata, const CUpti_SubscriberParams* params) {
  if (driver() == nullptr) return CUPTI_ERROR_NOT_INITIALIZED;
  if (subscriber == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  if (params != nullptr && params->structSize < CUpti_SubscriberParams_STRUCT_SIZE)
    return CUPTI_ERROR_INVALID_PARAMETER;
  std::lock_guard lock(g_subscribe_mu);
  if (const CUpti_Subscriber_st* old = g_current.load(std::memory_order_relaxed)) {
    if (params != nullptr) describe(*old, params->oldSubscriberName, params->oldSubscriberSize);
    return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  }
  auto* s = new CUpti_Subscriber_st{callback, userdata, {}, {}};
  if (params != nullptr && params->subscriberName != nullptr)
    s->name.assign(params->subscriberName, 0, CUPTI_SUBSCRIBER_NAME_MAX_LEN);
  for (CUpti_CallbackDomain d : kDomains)
    s->enabled[d] = std::make_unique<std::atomic<bool>[]>(domain_size(d));
  g_current.store(s, std::memory_order_release);
  *subscriber = s;
  return CUPTI_SUCCESS;
}

}  // namespace

void drop_subscriber() {
  std::lock_guard lock(g_subscribe_mu);
  retire_current();
}

namespace {

// One API callback to the current subscriber, if (domain, cbid) is enabled.
void deliver(CUpti_CallbackDomain domain, uint32_t cbid, bool exit, const char* name,
             const void* params, void* result, CUcontext ctx, uint32_t context_id,
             uint32_t correlation_id, uint64_t* correlation_data) {
  CUpti_Subscriber_st* s = g_current.load(std::memory_order_acquire);
  if (s == nullptr || !valid_cbid(domain, cbid) ||
      !s->enabled[domain][cbid].load(std::memory_order_relaxed) || s->callback == nullptr)
    return;
  CUpti_CallbackData data{};
  data.callbackSite = exit ? CUPTI_API_EXIT : CUPTI_API_ENTER;
  // The header promises functionName outlives the callback; the generated
  // table is static, the driver's string only a fallback.
  const char* table_name =
      domain == CUPTI_CB_DOMAIN_DRIVER_API ? driver_api_name(cbid) : runtime_api_name(cbid);
  data.functionName = table_name != nullptr ? table_name : name;
  data.functionParams = params;
  data.functionReturnValue = result;
  // The bridge carries no kernel name at API time (docs/sim.md).
  data.symbolName = nullptr;
  data.context = ctx;
  data.contextUid = context_id;
  data.correlationData = correlation_data;
  data.correlationId = correlation_id;
  s->callback(s->userdata, domain, cbid, &data);
}

}  // namespace

// The driver domain fires for every simulated entry point; the runtime domain
// only for what simcuda_runtime_launch emulates. The resource, synchronize,
// NVTX and state domains are not modelled.
void on_api(uint32_t cbid, bool exit, const char* name, const void* params, CUresult* result,
            CUcontext ctx, uint32_t context_id, uint32_t correlation_id,
            uint64_t* correlation_data) {
  deliver(CUPTI_CB_DOMAIN_DRIVER_API, cbid, exit, name, params, result, ctx, context_id,
          correlation_id, correlation_data);
}

void on_runtime_api(uint32_t cbid, bool exit, const char* name, const void* params, void* result,
                    CUcontext ctx, uint32_t context_id, uint32_t correlation_id,
                    uint64_t* correlation_data) {
  deliver(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, exit, name, params, result, ctx, context_id,
          correlation_id, correlation_data);
}

}  // namespace simcupti

using simcupti::ret;

CUptiResult cuptiSupportedDomains(size_t* domainCount, CUpti_DomainTable* domainTable) {
  if (domainCount == nullptr || domainTable == nullptr) return ret(CUPTI_ERROR_INVALID_PARAMETER);
  // CUpti_DomainTable is a non-const pointer: hand out a copy, so a client
  // writing through it cannot change what this library accepts.
  static std::array table = std::to_array(simcupti::kDomains);
  *domainCount = table.size();
  *domainTable = table.data();
  return CUPTI_SUCCESS;
}

CUptiResult cuptiSubscribe(CUpti_SubscriberHandle* subscriber, CUpti_CallbackFunc callback,
                           void* userdata) {
  if (CUptiResult f = simcupti::injected("cuptiSubscribe"); f != CUPTI_SUCCESS)
    return simcupti::ret(f);
  return ret(simcupti::subscribe(subscriber, callback, userdata, nullptr));
}

CUptiResult cuptiSubscribe_v2(CUpti_SubscriberHandle* subscriber, CUpti_CallbackFunc callback,
                              void* userdata, CUpti_SubscriberParams* pParams) {
  if (CUptiResult f = simcupti::injected("cuptiSubscribe"); f != CUPTI_SUCCESS)
    return simcupti::ret(f);
  return ret(simcupti::subscribe(subscriber, callback, userdata, pParams));
}

CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle subscriber) {
  if (CUptiResult f = simcupti::injected("cuptiUnsubscribe"); f != CUPTI_SUCCESS)
    return simcupti::ret(f);
  if (simcupti::driver() == nullptr) return ret(CUPTI_ERROR_NOT_INITIALIZED);
  std::lock_guard lock(simcupti::g_subscribe_mu);
  if (!simcupti::is_current(subscriber)) return ret(CUPTI_ERROR_INVALID_PARAMETER);
  simcupti::retire_current();
  return CUPTI_SUCCESS;
}

CUptiResult cuptiGetCallbackState(uint32_t* enable, CUpti_SubscriberHandle subscriber,
                                  CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  using namespace simcupti;
  if (driver() == nullptr) return ret(CUPTI_ERROR_NOT_INITIALIZED);
  if (enable == nullptr || !is_current(subscriber) || !valid_cbid(domain, cbid))
    return ret(CUPTI_ERROR_INVALID_PARAMETER);
  *enable = subscriber->enabled[domain][cbid].load(std::memory_order_relaxed) ? 1 : 0;
  return CUPTI_SUCCESS;
}

CUptiResult cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle subscriber,
                                CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  if (CUptiResult f = simcupti::injected("cuptiEnableCallback"); f != CUPTI_SUCCESS)
    return simcupti::ret(f);
  using namespace simcupti;
  if (driver() == nullptr) return ret(CUPTI_ERROR_NOT_INITIALIZED);
  if (!is_current(subscriber) || !valid_cbid(domain, cbid))
    return ret(CUPTI_ERROR_INVALID_PARAMETER);
  subscriber->enabled[domain][cbid].store(enable != 0, std::memory_order_relaxed);
  return CUPTI_SUCCESS;
}

CUptiResult cuptiEnableDomain(uint32_t enable, CUpti_SubscriberHandle subscriber,
                              CUpti_CallbackDomain domain) {
  using namespace simcupti;
  if (driver() == nullptr) return ret(CUPTI_ERROR_NOT_INITIALIZED);
  if (!is_current(subscriber) || domain_size(domain) == 0)
    return ret(CUPTI_ERROR_INVALID_PARAMETER);
  set_domain(subscriber, domain, enable != 0);
  return CUPTI_SUCCESS;
}

CUptiResult cuptiEnableAllDomains(uint32_t enable, CUpti_SubscriberHandle subscriber) {
  using namespace simcupti;
  if (driver() == nullptr) return ret(CUPTI_ERROR_NOT_INITIALIZED);
  if (!is_current(subscriber)) return ret(CUPTI_ERROR_INVALID_PARAMETER);
  for (CUpti_CallbackDomain d : kDomains) set_domain(subscriber, d, enable != 0);
  return CUPTI_SUCCESS;
}
