#include "stats.h"

#include <cstdio>

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
  std::string out = "{";
  auto add = [&](const char* k, uint64_t v) {
    if (out.size() > 1) out += ", ";
    out += "\"";
    out += k;
    out += "\": ";
    out += std::to_string(v);
  };
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
