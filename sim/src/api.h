// The one path every simulated driver entry point takes: count the call,
// charge its host cost on the virtual clock, apply fault injection, and fire
// the CUPTI enter/exit callbacks around the body with the real
// generated_cuda_meta.h parameter struct.
#pragma once

#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

// cupti.h brings the callback ids and generated_cuda_meta.h with the v1
// typedefs that header needs.
#include <cupti.h>

#include "clock.h"
#include "faults.h"
#include "state.h"
#include "stream.h"

namespace sim::api {

enum class Cost : uint8_t { kApi, kLaunch };

// The host cost of one call of `name` (not a launch), as configured; 0
// before cuInit (simcuda_call_cost_ns).
uint64_t call_cost_ns(const char* name);

// The correlation id of the call being made on this thread (0 outside one);
// ops enqueued by the body carry it into their activity records.
uint32_t current_correlation();

// The exported name of every driver entry point: the cuGetProcAddress table
// lists them all (SimEntryPoints.EveryDriverExportCanBeGivenACost checks it).
std::vector<std::string_view> entry_point_names();

// Resolves SIMCUDA_VMM_NS and SIMCUDA_CALL_NS (config.h) to a cost per
// exported name. An item naming no entry point is an error naming the
// variable, the item and the accepted forms.
bool configure_costs(const Config& cfg, std::unordered_map<std::string_view, uint64_t>* out,
                     std::string* error);

CUresult call_impl(uint32_t cbid, const char* name, void* params, size_t params_size, Cost cost,
                   CUresult (*body)(void*), void* body_ctx);

template <class Params, class Body>
CUresult call(uint32_t cbid, const char* name, Params& params, Cost cost, Body&& body) {
  static_assert(std::is_trivially_copyable_v<Params>);
  auto thunk = [](void* b) -> CUresult {
    return (*static_cast<std::remove_reference_t<Body>*>(b))();
  };
  return call_impl(cbid, name, &params, sizeof(Params), cost, thunk, &body);
}

// The current context, or the error a call without one gets.
#define SIM_CTX(ctx)             \
  ::sim::Context* ctx = nullptr; \
  if (CUresult e_ = ::sim::current_context(&ctx); e_ != CUDA_SUCCESS) return e_

#define SIM_NEED_CTX()                                                            \
  do {                                                                            \
    ::sim::Context* c_ = nullptr;                                                 \
    if (CUresult e_ = ::sim::current_context(&c_); e_ != CUDA_SUCCESS) return e_; \
  } while (0)

// The exported symbol's name, its CUPTI id and its parameter struct share a
// spelling:  cuFoo_v2_params p_{args...};  return SIM_INVOKE(cuFoo_v2, p_, body);
#define SIM_INVOKE(sym, params, ...) \
  ::sim::api::call(CUPTI_DRIVER_TRACE_CBID_##sym, #sym, params, ::sim::api::Cost::kApi, __VA_ARGS__)
#define SIM_INVOKE_LAUNCH(sym, params, ...)                                                \
  ::sim::api::call(CUPTI_DRIVER_TRACE_CBID_##sym, #sym, params, ::sim::api::Cost::kLaunch, \
                   __VA_ARGS__)

}  // namespace sim::api
