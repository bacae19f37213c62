#include "stats.h"

#include <cstdio>

#include "size.h"
#include "spillway_version.h"

namespace spillway {

void add_device(Stats* sum, const Stats& d) {
#define SUM(name) sum->name += d.name;
#define SAME(name) sum->name = d.name;
#define SPILLWAY_STAT(name, combine, meaning) combine(name)
#include "stats_fields.def"
#undef SPILLWAY_STAT
#undef SAME
#undef SUM
}

std::string to_json(const Stats& s, uint64_t steps) {
  // Which spillway wrote it, and the layout of its keys (spillway_version.h).
  std::string out = std::string("{\"version\": \"") + kVersion + "\"";
  auto add = [&](const char* k, uint64_t v) {
    if (out.size() > 1) out += ", ";
    out += "\"";
    out += k;
    out += "\": ";
    out += std::to_string(v);
  };
  add("schema", kJsonSchema);
  add("steps", steps);
#define SPILLWAY_STAT(name, combine, meaning) add(#name, s.name);
#include "stats_fields.def"
#undef SPILLWAY_STAT
  double frag = s.reserved_bytes ? 1.0 - static_cast<double>(s.live_bytes) /
                                             static_cast<double>(s.reserved_bytes)
                                 : 0.0;
  char buf[64];
  std::snprintf(buf, sizeof buf, ", \"fragmentation\": %.4f}", frag);
  return out + buf;
}

namespace {

// A duration for a person: "850 us", "12.3 ms", "4.56 s".
std::string format_ns(uint64_t ns) {
  char buf[32];
  if (ns < 1'000'000)
    std::snprintf(buf, sizeof buf, "%llu us", static_cast<unsigned long long>(ns / 1000));
  else if (ns < 1'000'000'000)
    std::snprintf(buf, sizeof buf, "%.1f ms", static_cast<double>(ns) / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.2f s", static_cast<double>(ns) / 1e9);
  return buf;
}

}  // namespace

std::string summary_line(const Stats& s) {
  char buf[512];
  std::snprintf(
      buf, sizeof buf,
      "peak resident %s (budget %s), evicted %llu blocks / %s, restored %llu blocks / "
      "%s, waited %s for transfers, host peak %s, %llu OOM%s",
      format_bytes(s.peak_resident_bytes).c_str(), format_bytes(s.budget_bytes).c_str(),
      static_cast<unsigned long long>(s.blocks_evicted), format_bytes(s.bytes_evicted).c_str(),
      static_cast<unsigned long long>(s.blocks_restored), format_bytes(s.bytes_restored).c_str(),
      format_ns(s.transfer_wait_ns).c_str(), format_bytes(s.peak_host_bytes).c_str(),
      static_cast<unsigned long long>(s.ooms), s.blind ? ", access tracking blind" : "");
  return buf;
}

std::string step_line(const Stats& now, const Stats& before) {
  auto d = [](uint64_t a, uint64_t b) { return static_cast<unsigned long long>(a - b); };
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s out (%llu blocks, %llu where a step plan placed them, %llu cancelled), %s in "
                "(%llu blocks, %llu prefetches used), waited %s for transfers",
                format_bytes(now.bytes_evicted - before.bytes_evicted).c_str(),
                d(now.blocks_evicted, before.blocks_evicted),
                d(now.planned_evictions, before.planned_evictions),
                d(now.evictions_cancelled, before.evictions_cancelled),
                format_bytes(now.bytes_restored - before.bytes_restored).c_str(),
                d(now.blocks_restored, before.blocks_restored),
                d(now.prefetches_used, before.prefetches_used),
                format_ns(now.transfer_wait_ns - before.transfer_wait_ns).c_str());
  return buf;
}

}  // namespace spillway
