#include "driver.h"

#include <dlfcn.h>

#include <mutex>

#include "log.h"

namespace spillway::cu {
namespace {

Driver g_driver;
const Driver* g_loaded = nullptr;
std::string g_why;

void load_once() {
  // RTLD_LOCAL: the driver's symbols must not become the process's.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = dlerror();
    g_why = std::string("cannot load libcuda.so.1: ") + (err ? err : "unknown error");
    return;
  }
  using GetProc =
      CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  auto get_proc = reinterpret_cast<GetProc>(dlsym(lib, "cuGetProcAddress_v2"));
  if (!get_proc) {
    g_why = "libcuda.so.1 has no cuGetProcAddress_v2: the driver is older than CUDA 12.5";
    return;
  }
  int version = 0;
  auto get_version = reinterpret_cast<CUresult (*)(int*)>(dlsym(lib, "cuDriverGetVersion"));
  if (get_version && get_version(&version) == CUDA_SUCCESS && version < kCudaVersion) {
    g_why = "the CUDA driver supports CUDA " + std::to_string(version / 1000) + "." +
            std::to_string(version % 1000 / 10) + "; spillway needs " +
            std::to_string(kCudaVersion / 1000) + "." + std::to_string(kCudaVersion % 1000 / 10);
    return;
  }
  auto resolve = [&](const char* name, void** slot) {
    CUdriverProcAddressQueryResult status{};
    CUresult r = get_proc(name, slot, kCudaVersion, CU_GET_PROC_ADDRESS_DEFAULT, &status);
    if (r != CUDA_SUCCESS || !*slot) {
      if (g_why.empty()) g_why = std::string("the CUDA driver does not provide ") + name;
      return false;
    }
    return true;
  };
  bool ok = true;
#define DRIVER_ENTRY_POINT(name) \
  ok = resolve(#name, reinterpret_cast<void**>(&g_driver.name)) && ok;
#include "driver_entry_points.def"
#undef DRIVER_ENTRY_POINT
  if (ok) g_loaded = &g_driver;
}

}  // namespace

const Driver* load(std::string* why) {
  static std::once_flag once;
  std::call_once(once, load_once);
  if (!g_loaded && why) *why = g_why;
  return g_loaded;
}

std::string describe(const Driver& d, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.cuGetErrorName(r, &name) != CUDA_SUCCESS || !name) return "CUresult " + std::to_string(r);
  std::string out = name;
  if (d.cuGetErrorString(r, &text) == CUDA_SUCCESS && text) out += std::string(" (") + text + ")";
  return out;
}

void log_failure(const Driver& d, const std::string& call, CUresult r) {
  log::warn("{} failed: {}", call, describe(d, r));
}

}  // namespace spillway::cu
