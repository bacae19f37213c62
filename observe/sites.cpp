#include "sites.h"

#include <dlfcn.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <vector>

namespace spillway {
namespace {

constexpr int kMaxFrames = 24;

// This library's base address, to skip its own frames.
const void* own_base() {
  static const void* base = [] {
    Dl_info info{};
    return dladdr(reinterpret_cast<const void*>(&own_base), &info) ? info.dli_fbase : nullptr;
  }();
  return base;
}

const char* basename_of(const char* path) {
  const char* slash = path ? std::strrchr(path, '/') : nullptr;
  return slash ? slash + 1 : (path ? path : "?");
}

}  // namespace

std::unique_ptr<Sites> Sites::start(size_t min_block, std::string* why) {
  void* lib = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    *why = std::string("cannot load libunwind.so.8: ") + dlerror();
    return nullptr;
  }
  auto bt = reinterpret_cast<Backtrace>(dlsym(lib, "unw_backtrace"));
  if (!bt) {
    *why = "libunwind.so.8 has no unw_backtrace";
    return nullptr;
  }
  return std::unique_ptr<Sites>(new Sites(min_block, bt));
}

std::string Sites::name_of(void* const* frames, int n) const {
  // The first frame outside spillway and outside PyTorch's allocator layer
  // (libc10*.so); failing that, the first outside spillway.
  int pick = -1, fallback = -1;
  Dl_info info{};
  for (int i = 0; i < n; ++i) {
    if (!dladdr(frames[i], &info) || info.dli_fbase == own_base()) continue;
    if (fallback < 0) fallback = i;
    if (std::strstr(basename_of(info.dli_fname), "libc10") == nullptr) {
      pick = i;
      break;
    }
  }
  if (pick < 0) pick = fallback;
  if (pick < 0 || !dladdr(frames[pick], &info)) return "unknown";
  char buf[512];
  const auto addr = reinterpret_cast<uintptr_t>(frames[pick]);
  if (info.dli_sname)
    std::snprintf(buf, sizeof buf, "%s!%s+0x%" PRIxPTR, basename_of(info.dli_fname), info.dli_sname,
                  addr - reinterpret_cast<uintptr_t>(info.dli_saddr));
  else
    std::snprintf(buf, sizeof buf, "%s+0x%" PRIxPTR, basename_of(info.dli_fname),
                  addr - reinterpret_cast<uintptr_t>(info.dli_fbase));
  return buf;
}

void Sites::annotate(Allocation& a) {
  if (a.size < min_block_) return;
  void* frames[kMaxFrames];
  const int n = backtrace_(frames, kMaxFrames);
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the return addresses
  for (int i = 0; i < n; ++i) {
    h ^= reinterpret_cast<uintptr_t>(frames[i]);
    h *= 1099511628211ull;
  }
  std::lock_guard lk(mu_);
  auto& site = sites_[h];
  if (!site) {
    site = std::make_unique<Site>();
    site->name = name_of(frames, n);
  }
  ++site->allocations;
  site->bytes_allocated += a.size;
  live_[reinterpret_cast<uintptr_t>(a.ptr)] = site.get();
  a.site = site->name.c_str();
}

void Sites::on_free(const Allocation& a) {
  std::lock_guard lk(mu_);
  live_.erase(reinterpret_cast<uintptr_t>(a.ptr));
}

void Sites::annotate(Transfer& t) {
  std::lock_guard lk(mu_);
  if (auto it = live_.find(t.ptr); it != live_.end()) {
    t.site = it->second->name.c_str();  // Sites are never erased: the name stays valid
    if (t.to_host) {
      ++it->second->evictions;
      it->second->bytes_evicted += t.bytes;
    }
  }
}

std::string Sites::top(size_t n) const {
  std::lock_guard lk(mu_);
  std::vector<const Site*> v;
  for (auto& [h, s] : sites_)
    if (s->bytes_evicted > 0) v.push_back(s.get());
  std::sort(v.begin(), v.end(),
            [](const Site* a, const Site* b) { return a->bytes_evicted > b->bytes_evicted; });
  std::string out;
  for (size_t i = 0; i < v.size() && i < n; ++i) {
    char line[640];
    std::snprintf(line, sizeof line,
                  "%s%" PRIu64 " bytes evicted in %" PRIu64 " evictions, %" PRIu64
                  " allocations: %s",
                  out.empty() ? "" : "\n", v[i]->bytes_evicted, v[i]->evictions, v[i]->allocations,
                  v[i]->name.c_str());
    out += line;
  }
  return out;
}

}  // namespace spillway
