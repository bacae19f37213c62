#include "driver.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>

namespace simcupti {
namespace {

constinit std::mutex g_attach_mu;
std::atomic<const simbridge::DriverInfo*> g_info{nullptr};
// The driver keeps pointers to both for the rest of the process.
simbridge::DriverInfo g_info_storage;
constexpr simbridge::Hooks kHooks{simbridge::kVersion, &on_api, &on_activity, &on_runtime_api};

const simbridge::DriverInfo* attach() {
  // The driver the application already loaded is the one to hook; loading
  // one ourselves only happens when CUPTI is called before any driver call.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (lib == nullptr) return nullptr;
  auto attach_fn =
      reinterpret_cast<decltype(&simcuda_cupti_attach)>(dlsym(lib, "simcuda_cupti_attach"));
  if (attach_fn == nullptr || !attach_fn(&kHooks, &g_info_storage)) {
    dlclose(lib);
    return nullptr;
  }
  // `lib` stays open: the driver must outlive the hooks it calls into us.
  return &g_info_storage;
}

}  // namespace

const simbridge::DriverInfo* driver() {
  if (const auto* info = g_info.load(std::memory_order_acquire)) return info;
  std::lock_guard lock(g_attach_mu);
  if (const auto* info = g_info.load(std::memory_order_relaxed)) return info;
  const auto* info = attach();
  g_info.store(info, std::memory_order_release);
  return info;
}

}  // namespace simcupti
