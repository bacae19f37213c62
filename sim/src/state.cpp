#include "state.h"

#include <cstdarg>
#include <cstdio>

#include "api.h"
#include "device_access.h"
#include "faults.h"
#include "memory.h"
#include "stream.h"

namespace sim {
namespace {

std::atomic<State*> g_state{nullptr};
std::mutex g_init_mu;
CUresult g_init_result = CUDA_ERROR_NOT_INITIALIZED;
bool g_log = false;

thread_local std::vector<Context*> t_ctx_stack;  // current context is back()

}  // namespace

namespace {
std::atomic<const simbridge::Hooks*> g_hooks{nullptr};
}
const simbridge::Hooks* cupti_hooks() {
  return g_hooks.load(std::memory_order_acquire);
}
void set_cupti_hooks(const simbridge::Hooks* hooks) {
  g_hooks.store(hooks, std::memory_order_release);
}

State* state() {
  return g_state.load(std::memory_order_acquire);
}

CUresult init_state() {
  std::lock_guard lk(g_init_mu);
  if (g_state.load()) return CUDA_SUCCESS;
  if (g_init_result != CUDA_ERROR_NOT_INITIALIZED) return g_init_result;
  std::string error;
  auto cfg = load_config(&error);
  if (!cfg) {
    std::fprintf(stderr, "%s\n", error.c_str());
    g_init_result = CUDA_ERROR_INVALID_VALUE;
    return g_init_result;
  }
  if (!faults::configure(cfg->fail_spec, &error)) {
    std::fprintf(stderr, "%s\n", error.c_str());
    g_init_result = CUDA_ERROR_INVALID_VALUE;
    return g_init_result;
  }
  std::unordered_map<std::string_view, uint64_t> call_ns;
  if (!api::configure_costs(*cfg, &call_ns, &error)) {
    std::fprintf(stderr, "%s\n", error.c_str());
    g_init_result = CUDA_ERROR_INVALID_VALUE;
    return g_init_result;
  }
  g_log = cfg->log;
  auto* st = new State;  // never destroyed: detached stream workers may outlive main
  st->config = *cfg;
  st->call_ns = std::move(call_ns);
  mem::init(st->config);
  device_access::install();
  for (int d = 0; d < cfg->device_count; ++d) {
    auto dev = std::make_unique<Device>();
    dev->ordinal = d;
    st->devices.push_back(std::move(dev));
    auto ctx = std::make_unique<Context>();
    ctx->device = d;
    ctx->id = static_cast<uint32_t>(d + 1);
    st->primary.push_back(std::move(ctx));
  }
  g_state.store(st, std::memory_order_release);
  // Legacy streams need the state published (their workers read it).
  for (auto& ctx : st->primary) ctx->legacy = stream::create_legacy(ctx.get());
  return CUDA_SUCCESS;
}

uint64_t new_handle() {
  State& st = *state();
  std::lock_guard lk(st.handles_mu);
  st.next_handle += 0x10;
  return st.next_handle;
}

std::vector<Context*>& context_stack() {
  return t_ctx_stack;
}

CUresult current_context(Context** out) {
  if (!state()) return CUDA_ERROR_NOT_INITIALIZED;
  if (t_ctx_stack.empty() || !t_ctx_stack.back()) return CUDA_ERROR_INVALID_CONTEXT;
  Context* ctx = t_ctx_stack.back();
  if (ctx->retain_count.load() <= 0) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  if (CUresult e = ctx->sticky.load(); e != CUDA_SUCCESS) return e;
  *out = ctx;
  return CUDA_SUCCESS;
}

Context* context_from_handle(CUcontext handle) {
  State* st = state();
  if (!st) return nullptr;
  for (auto& c : st->primary)
    if (reinterpret_cast<CUcontext>(c.get()) == handle) return c.get();
  return nullptr;
}

void set_sticky(Context* ctx, CUresult err, const std::string& what) {
  std::lock_guard lk(ctx->sticky_mu);
  if (ctx->sticky.load() != CUDA_SUCCESS) return;
  ctx->sticky_what = what;
  ctx->sticky.store(err);
  std::fprintf(stderr, "simcuda: context %u: %s (sticky CUDA_ERROR_ILLEGAL_ADDRESS)\n", ctx->id,
               what.c_str());
}

CUresult refuse(CUresult err, const char* fmt, ...) {
  if (g_log) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    std::fprintf(stderr, "simcuda: %s\n", buf);
  }
  return err;
}

}  // namespace sim
