// The exported C ABI (shim/include/spillway.h). Everything else in the shim
// has hidden visibility.
#include <spillway.h>

#include <cstring>

#include <fmt/format.h>

#include "config.h"
#include "runtime.h"
#include "spillway_version.h"

extern char** environ;

using spillway::Runtime;

#define ABI_EXPORT extern "C" __attribute__((visibility("default")))

ABI_EXPORT void* spillway_malloc(size_t size, int device, CUstream_st* stream) {
  Runtime& rt = Runtime::get();
  spillway::Allocator* a = rt.allocator(device);
  if (a) {
    void* p = a->malloc(size, stream);
    if (p && !rt.observers().empty()) rt.observers().on_alloc({p, size, stream, device, nullptr});
    return p;
  }
  if (size) rt.note_unserved();
  return nullptr;
}

ABI_EXPORT void spillway_free(void* ptr, size_t size, int device, CUstream_st* stream) {
  if (!ptr) return;
  Runtime& rt = Runtime::get();
  spillway::Allocator* a = rt.allocator(device);
  if (a && !rt.observers().empty()) rt.observers().on_free({ptr, size, stream, device, nullptr});
  if (a && a->try_free(ptr, size, stream)) return;
  // Freed on another device than its own: a caller's bug that must not free
  // the other device's block (or cost a byte); the owner names it.
  const int owner = rt.device_of(ptr);
  if (owner >= 0 && owner != device)
    rt.allocator(owner)->refuse_free(
        ptr, size, stream,
        fmt::format("freed on device {}, but allocated on device {}", device, owner));
  else if (a)
    a->refuse_free(ptr, size, stream,
                   "not a live spillway allocation (double free or unknown pointer)");
}

ABI_EXPORT const char* spillway_version(void) {
  return spillway::kVersion;
}

ABI_EXPORT void spillway_mark_step(void) {
  Runtime::get().mark_step();
}

ABI_EXPORT size_t spillway_stats_json(char* buf, size_t len) {
  Runtime* rt = Runtime::peek();
  std::string json = rt ? spillway::to_json(rt->stats(), rt->steps()) : spillway::to_json({}, 0);
  if (buf && len > 0) {
    size_t n = std::min(len - 1, json.size());
    std::memcpy(buf, json.data(), n);
    buf[n] = '\0';
  }
  return json.size();
}

ABI_EXPORT void spillway_reset_peak_stats(void) {
  if (Runtime* rt = Runtime::peek()) rt->reset_recent_peaks();
}

namespace {
int pin(const void* ptr, size_t size, bool on) {
  Runtime* rt = Runtime::peek();
  if (!rt || !ptr) return -1;
  const auto lo = reinterpret_cast<uintptr_t>(ptr);
  const spillway::Touch t{lo, lo + (size ? size : 1)};
  if (on) {
    rt->hold(&t, 1);
  } else {
    rt->release(&t, 1);
  }
  return 0;
}
}  // namespace

ABI_EXPORT int spillway_pin(const void* ptr, size_t size) {
  return pin(ptr, size, true);
}

ABI_EXPORT int spillway_unpin(const void* ptr, size_t size) {
  return pin(ptr, size, false);
}

ABI_EXPORT int spillway_prefetch(const void* ptr, size_t size) {
  Runtime* rt = Runtime::peek();
  if (!rt || !ptr) return -1;
  const auto lo = reinterpret_cast<uintptr_t>(ptr);
  const spillway::Touch t{lo, lo + (size ? size : 1)};
  rt->prefetch(&t, 1);
  return 0;
}

ABI_EXPORT int spillway_check_config(char* msg, size_t len) {
  std::string error;
  if (spillway::parse_config(environ, &error)) error.clear();
  if (msg && len > 0) {
    size_t n = std::min(len - 1, error.size());
    std::memcpy(msg, error.data(), n);
    msg[n] = '\0';
  }
  return error.empty() ? 0 : 1;
}
