// The common call path (api.h) and the sim-only exports (simcuda.h and the
// CUPTI bridge).
#include <simcuda.h>

#include <algorithm>
#include <cstring>

#include "api.h"
#include "clock.h"
#include "memory.h"

namespace sim::api {
namespace {
thread_local uint32_t t_correlation = 0;

// The host cost of one call of `name` (docs/sim.md, "Virtual clock").
uint64_t host_cost(const State& st, const char* name, Cost cost) {
  if (!st.call_ns.empty())
    if (auto it = st.call_ns.find(name); it != st.call_ns.end()) return it->second;
  return cost == Cost::kLaunch ? st.config.launch_ns : st.config.api_ns;
}

bool is_vmm(const char* name) {
  for (const char* n : {"cuMemMap", "cuMemUnmap", "cuMemSetAccess", "cuMemCreate", "cuMemRelease"})
    if (std::strcmp(name, n) == 0) return true;
  return false;
}

// A VMM call takes `ns` of the driver's one VMM timeline: the first gap of
// that length at or after the caller's clock, between the calls other
// threads made there (first come, first served in real time).
void occupy_vmm(State& st, uint64_t ns) {
  std::lock_guard lk(st.vmm_mu);
  auto& busy = st.vmm_busy;
  uint64_t start = clock::now();
  // The calls never overlap, so their ends ascend with their starts: the
  // first that ends after the caller's clock is found by bisection.
  auto at = std::lower_bound(busy.begin(), busy.end(), start,
                             [](const auto& b, uint64_t t) { return b.second <= t; });
  for (; at != busy.end() && at->first < start + ns; ++at) start = std::max(start, at->second);
  busy.insert(at, {start, start + ns});
  while (busy.size() > 1024) busy.pop_front();  // only the recent past matters
  clock::advance_to(start + ns);
}
}  // namespace

uint32_t current_correlation() {
  return t_correlation;
}

bool configure_costs(const Config& cfg, std::unordered_map<std::string_view, uint64_t>* out,
                     std::string* error) {
  const std::vector<std::string_view> names = entry_point_names();
  // Sets the cost of every entry point `rule` matches; false if none does.
  auto apply = [&](std::string_view rule, uint64_t ns) {
    bool any = false;
    for (std::string_view n : names)
      if (faults::matches(rule, n)) {
        (*out)[n] = ns;
        any = true;
      }
    return any;
  };
  if (cfg.vmm_ns)
    for (std::string_view n :
         {"cuMemMap", "cuMemUnmap", "cuMemSetAccess", "cuMemCreate", "cuMemRelease"})
      apply(n, *cfg.vmm_ns);
  // Later than SIMCUDA_VMM_NS, so its items win.
  for (const auto& [rule, ns] : cfg.call_ns) {
    if (apply(rule, ns)) continue;
    *error = "simcuda: SIMCUDA_CALL_NS='" + cfg.call_ns_spec + "': '" + rule +
             "' names no driver entry point of the sim; accepted: " + kCallNsForms;
    return false;
  }
  return true;
}

CUresult call_impl(uint32_t cbid, const char* name, void* params, size_t params_size, Cost cost,
                   CUresult (*body)(void*), void* body_ctx) {
  // cuda.h (cuLaunchHostFunc): a host function must not call CUDA.
  if (stream::in_host_function())
    return refuse(CUDA_ERROR_NOT_PERMITTED, "%s called from a host function", name);
  const CUresult injected = faults::on_call(name);
  State* st = state();
  if (st) {
    const uint64_t ns = host_cost(*st, name, cost);
    if (ns && is_vmm(name))
      occupy_vmm(*st, ns);
    else
      clock::advance(ns);
  }
  const uint32_t corr = st ? st->next_correlation.fetch_add(1) : 0;
  const uint32_t outer = t_correlation;
  t_correlation = corr;

  const simbridge::Hooks* hooks = cupti_hooks();
  CUcontext ctx_handle = nullptr;
  uint32_t ctx_id = 0;
  if (hooks && st && !context_stack().empty() && context_stack().back()) {
    ctx_handle = reinterpret_cast<CUcontext>(context_stack().back());
    ctx_id = context_stack().back()->id;
  }
  uint64_t correlation_data = 0;
  CUresult result = CUDA_SUCCESS;
  if (hooks && hooks->api)
    hooks->api(cbid, false, name, params, &result, ctx_handle, ctx_id, corr, &correlation_data);
  result = injected != CUDA_SUCCESS ? injected : body(body_ctx);
  // The first cuInit creates the state, and its cost with it.
  if (!st && (st = state())) clock::advance(host_cost(*st, name, cost));
  if (injected != CUDA_SUCCESS) refuse(injected, "%s: injected failure (SIMCUDA_FAIL)", name);
  if (hooks && hooks->api)
    hooks->api(cbid, true, name, params, &result, ctx_handle, ctx_id, corr, &correlation_data);
  // CUPTI documents functionParams as valid only during the callback; make
  // a subscriber that keeps the pointer read garbage, not stale truth.
  std::memset(params, 0xA5, params_size);
  t_correlation = outer;
  return result;
}

uint64_t call_cost_ns(const char* name) {
  const State* st = state();
  return st && name ? host_cost(*st, name, Cost::kApi) : 0;
}

}  // namespace sim::api

using namespace sim;

namespace {
Context* current_or_null() {
  auto& stack = context_stack();
  return stack.empty() ? nullptr : stack.back();
}
}  // namespace

extern "C" {

__attribute__((visibility("default"))) bool simcuda_cupti_attach(const simbridge::Hooks* hooks,
                                                                 simbridge::DriverInfo* info) {
  if (hooks && hooks->version != simbridge::kVersion) return false;
  if (info) {
    info->now_ns = [] { return clock::now(); };
    info->context_id = [](CUcontext c) -> uint32_t {
      Context* ctx = context_from_handle(c);
      return ctx ? ctx->id : 0;
    };
    // cupti_activity.h: the context argument is "typically null", meaning
    // the calling thread's current context.
    info->device_id = [](CUcontext c) -> uint32_t {
      Context* ctx = c ? context_from_handle(c) : current_or_null();
      return ctx ? static_cast<uint32_t>(ctx->device) : UINT32_MAX;
    };
    info->stream_id = [](CUcontext c, CUstream h) -> uint32_t {
      Context* ctx = c ? context_from_handle(c) : current_or_null();
      std::shared_ptr<Stream> s;
      if (ctx && stream::resolve(ctx, h, &s) == CUDA_SUCCESS) return s->stream_id;
      // A created stream knows its own context.
      if (stream::find_created(h, &s)) return s->stream_id;
      return 0;
    };
  }
  set_cupti_hooks(hooks);
  return true;
}

uint64_t simcuda_now_ns(void) {
  return clock::now();
}
void simcuda_host_advance_ns(uint64_t ns) {
  clock::advance(ns);
}

uint64_t simcuda_device_idle_at_ns(int device) {
  State* st = state();
  if (!st || device < 0 || device >= static_cast<int>(st->devices.size())) return 0;
  return st->devices[static_cast<size_t>(device)]->idle_at.load();
}

uint64_t simcuda_call_count(const char* name) {
  return name ? faults::count(name) : 0;
}

uint64_t simcuda_call_cost_ns(const char* name) {
  return api::call_cost_ns(name);
}

void simcuda_get_memory_stats(int device, simcuda_memory_stats* out) {
  if (!out) return;
  std::memset(out, 0, sizeof *out);
  mem::Stats s = mem::stats(device);
  out->device_capacity = s.device_capacity;
  out->device_used = s.device_used;
  out->device_peak = s.device_peak;
  out->host_capacity = s.host_capacity;
  out->host_used = s.host_used;
  out->host_peak = s.host_peak;
  State* st = state();
  if (st && device >= 0 && device < static_cast<int>(st->devices.size())) {
    Device& d = *st->devices[static_cast<size_t>(device)];
    out->bytes_h2d = d.bytes_h2d.load();
    out->bytes_d2h = d.bytes_d2h.load();
    out->remote_access_bytes = d.remote_access_bytes.load();
    out->managed_fault_bytes = d.managed_fault_bytes.load();
  }
}

uint64_t simcuda_managed_device_bytes(CUdeviceptr ptr, size_t size) {
  if (!state()) return 0;
  return mem::managed_device_bytes(static_cast<uintptr_t>(ptr), size);
}

uint64_t simcuda_mapping_signature(CUdeviceptr ptr, size_t size) {
  if (!state()) return 0;
  const auto lo = static_cast<uintptr_t>(ptr);
  return mem::mapping_signature(lo, lo + size);
}

CUresult simcuda_set_external_usage(int device, uint64_t bytes) {
  if (!state()) return CUDA_ERROR_NOT_INITIALIZED;
  return mem::set_external_usage(device, bytes);
}

CUresult simcuda_sticky_error(int device, char* buf, size_t len) {
  State* st = state();
  if (!st) return CUDA_ERROR_NOT_INITIALIZED;
  if (device < 0 || device >= static_cast<int>(st->primary.size()))
    return CUDA_ERROR_INVALID_DEVICE;
  Context& ctx = *st->primary[static_cast<size_t>(device)];
  std::lock_guard lk(ctx.sticky_mu);
  if (buf && len) {
    std::strncpy(buf, ctx.sticky_what.c_str(), len - 1);
    buf[len - 1] = '\0';
  }
  return ctx.sticky.load();
}

CUresult simcuda_fail_call(const char* name, uint64_t nth, int and_after, CUresult error) {
  if (!name || !faults::add(name, nth, and_after != 0, error)) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

void simcuda_clear_faults(void) {
  faults::clear();
}

}  // extern "C"
