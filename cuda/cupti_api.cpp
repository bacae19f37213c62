#include "cupti_api.h"

#include <dlfcn.h>

#include <mutex>

namespace spillway::cupti {

const Api* load(const std::string& path, std::string* why) {
  static Api api;
  static const Api* loaded = nullptr;
  static std::string reason;
  static std::once_flag once;
  std::call_once(once, [&] {
    const std::string lib = path.empty() ? "libcupti.so.13" : path;
    void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = dlerror();
      reason = "cannot load " + lib + ": " + (e ? e : "unknown error");
      return;
    }
    bool ok = true;
#define CUPTI_ENTRY_POINT(name)                                     \
  api.name = reinterpret_cast<decltype(api.name)>(dlsym(h, #name)); \
  if (!api.name && ok) {                                            \
    ok = false;                                                     \
    reason = lib + " has no " #name;                                \
  }
#include "cupti_entry_points.def"
#undef CUPTI_ENTRY_POINT
    if (ok) loaded = &api;
  });
  if (!loaded && why) *why = reason;
  return loaded;
}

}  // namespace spillway::cupti
