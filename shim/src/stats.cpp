#include "stats.h"

#include <cstdio>

namespace spillway {

std::string to_json(const Stats& s, uint64_t steps) {
  std::string out = "{";
  auto add = [&](const char* k, uint64_t v) {
    if (out.size() > 1) out += ", ";
    out += "\"";
    out += k;
    out += "\": ";
    out += std::to_string(v);
  };
  add("steps", steps);
  add("blind", s.blind);
  add("budget_bytes", s.budget_bytes);
  add("host_budget_bytes", s.host_budget_bytes);
  add("resident_bytes", s.resident_bytes);
  add("peak_resident_bytes", s.peak_resident_bytes);
  add("live_bytes", s.live_bytes);
  add("peak_live_bytes", s.peak_live_bytes);
  add("reserved_bytes", s.reserved_bytes);
  add("small_pool_bytes", s.small_pool_bytes);
  add("host_bytes", s.host_bytes);
  add("peak_host_bytes", s.peak_host_bytes);
  add("mallocs", s.mallocs);
  add("frees", s.frees);
  add("cache_hits", s.cache_hits);
  add("bad_frees", s.bad_frees);
  add("ooms", s.ooms);
  add("blocks_evicted", s.blocks_evicted);
  add("blocks_restored", s.blocks_restored);
  add("bytes_evicted", s.bytes_evicted);
  add("bytes_restored", s.bytes_restored);
  add("evictions_failed", s.evictions_failed);
  add("evictions_cancelled", s.evictions_cancelled);
  add("background_batches", s.background_batches);
  add("device_creates", s.device_creates);
  add("host_creates", s.host_creates);
  add("cached_releases", s.cached_releases);
  double frag = s.reserved_bytes ? 1.0 - static_cast<double>(s.live_bytes) /
                                             static_cast<double>(s.reserved_bytes)
                                 : 0.0;
  char buf[64];
  std::snprintf(buf, sizeof buf, ", \"fragmentation\": %.4f}", frag);
  return out + buf;
}

std::string summary_line(const Stats& s) {
  auto mib = [](uint64_t b) { return static_cast<double>(b) / (1 << 20); };
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "peak resident %.1f MiB (budget %.1f MiB), evicted %llu blocks / %.1f MiB, "
                "restored %llu blocks / %.1f MiB, host peak %.1f MiB, %llu OOM%s",
                mib(s.peak_resident_bytes), mib(s.budget_bytes),
                static_cast<unsigned long long>(s.blocks_evicted), mib(s.bytes_evicted),
                static_cast<unsigned long long>(s.blocks_restored), mib(s.bytes_restored),
                mib(s.peak_host_bytes), static_cast<unsigned long long>(s.ooms),
                s.blind ? ", access tracking blind" : "");
  return buf;
}

}  // namespace spillway
