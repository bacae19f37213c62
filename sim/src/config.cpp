#include "config.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <unistd.h>

namespace sim {

std::optional<uint64_t> parse_size(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || end == text.c_str() || !std::isfinite(v) || v < 0) return std::nullopt;
  std::string unit(end);
  struct Unit {
    const char* name;
    double mult;
  };
  static constexpr Unit kUnits[] = {{"", 1},          {"B", 1},         {"KiB", 1024.0},
                                    {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1099511627776.0},
                                    {"KB", 1e3},      {"MB", 1e6},      {"GB", 1e9},
                                    {"TB", 1e12}};
  for (const Unit& u : kUnits) {
    if (unit == u.name) {
      double bytes = v * u.mult;
      if (bytes > 1.8e19 || bytes != std::floor(bytes)) return std::nullopt;
      return static_cast<uint64_t>(bytes);
    }
  }
  return std::nullopt;
}

const char* const kCallNsForms =
    "name:ns[,name:ns...], name an exported driver entry point (cuMemMap, "
    "cuMemcpyHtoDAsync_v2) or a base name (cuMemcpyHtoDAsync: all its versions and "
    "_ptsz/_ptds variants), ns an integer number of nanoseconds up to 1 s, with an optional "
    "unit ns, us or ms; e.g. cuMemMap:20us,cuMemUnmap:20000";

std::optional<uint64_t> parse_ns(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0 || digits > 10) return std::nullopt;
  const uint64_t v = std::stoull(text.substr(0, digits));
  const std::string unit = text.substr(digits);
  uint64_t mult = 0;
  if (unit.empty() || unit == "ns")
    mult = 1;
  else if (unit == "us")
    mult = 1000;
  else if (unit == "ms")
    mult = 1000000;
  else
    return std::nullopt;
  if (v > 1000000000ull / mult) return std::nullopt;  // at most 1 s, like SIMCUDA_API_NS
  return v * mult;
}

std::string shown(const std::string& v) {
  std::string out;
  for (const char ch : v) {
    const auto u = static_cast<unsigned char>(ch);
    if (u < 0x20 || u == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += ch;
    }
  }
  return out;
}

std::optional<uint64_t> parse_uint(const std::string& text) {
  // Digits only: strtoull alone would take leading blanks, a sign (and wrap
  // a negative number around).
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return std::nullopt;
  return v;
}

namespace {

std::optional<double> parse_positive(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || errno != 0 || *end != '\0' || !(v > 0) || !std::isfinite(v))
    return std::nullopt;
  return v;
}

struct Reader {
  std::string* error;
  bool ok = true;

  const char* get(const char* name) {
    const char* v = std::getenv(name);
    return (v && *v) ? v : nullptr;
  }
  void fail(const char* name, const char* value, const char* accepted) {
    if (!ok) return;
    ok = false;
    *error = std::string("simcuda: ") + name + "='" + shown(value) +
             "' is not valid; accepted: " + accepted;
  }
  void size(const char* name, uint64_t* out, uint64_t min) {
    if (const char* v = get(name)) {
      auto s = parse_size(v);
      if (!s || *s < min) return fail(name, v, "a byte size such as 80GiB, 512MiB, 1.5GB or 4096");
      *out = *s;
    }
  }
  void uint(const char* name, uint64_t* out, uint64_t min, uint64_t max) {
    if (const char* v = get(name)) {
      auto s = parse_uint(v);
      if (!s || *s < min || *s > max) {
        std::string acc =
            "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
        return fail(name, v, acc.c_str());
      }
      *out = *s;
    }
  }
  void gbps(const char* name, double* out) {
    if (const char* v = get(name)) {
      auto s = parse_positive(v);
      if (!s) return fail(name, v, "a positive number of GB/s (10^9 bytes per second), e.g. 55");
      *out = *s;  // GB/s == bytes per ns
    }
  }
  void ns(const char* name, std::optional<uint64_t>* out) {
    if (const char* v = get(name)) {
      auto s = parse_ns(v);
      if (!s)
        return fail(name, v,
                    "an integer number of nanoseconds up to 1 s, with an optional unit ns, us "
                    "or ms, e.g. 20us or 20000");
      *out = *s;
    }
  }
  // SIMCUDA_CALL_NS: name:ns,... (the names are checked at cuInit, against
  // the entry points, by the library: sim::api::configure_costs).
  void call_ns(const char* name, Config* c) {
    const char* v = get(name);
    if (!v) return;
    const std::string spec = v;
    c->call_ns_spec = spec;
    size_t pos = 0;
    while (ok && pos <= spec.size()) {
      const size_t comma = spec.find(',', pos);
      const std::string item =
          spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      pos = comma == std::string::npos ? spec.size() + 1 : comma + 1;
      auto bad = [&](const char* why) {
        ok = false;
        *error = std::string("simcuda: ") + name + "='" + shown(spec) + "': item '" + shown(item) +
                 "' " + why + "; accepted: " + kCallNsForms;
      };
      const size_t colon = item.find(':');
      if (colon == std::string::npos || colon == 0) return bad("has no name:ns");
      auto t = parse_ns(item.substr(colon + 1));
      if (!t) return bad("has no valid number of nanoseconds");
      c->call_ns.emplace_back(item.substr(0, colon), *t);
    }
  }
  void flag(const char* name, bool* out) {
    if (const char* v = get(name)) {
      if (std::strcmp(v, "0") == 0)
        *out = false;
      else if (std::strcmp(v, "1") == 0)
        *out = true;
      else
        fail(name, v, "0 or 1");
    }
  }
};

}  // namespace

std::optional<Config> load_config(std::string* error) {
  Config c;
  Reader r{error};
  uint64_t devices = static_cast<uint64_t>(c.device_count);
  r.uint("SIMCUDA_DEVICE_COUNT", &devices, 1, 8);
  c.device_count = static_cast<int>(devices);
  r.size("SIMCUDA_DEVICE_MEMORY", &c.device_memory, 1);
  r.size("SIMCUDA_HOST_MEMORY", &c.host_memory, 1);
  r.size("SIMCUDA_GRANULARITY", &c.granularity, 4096);
  if (r.ok && (c.granularity & (c.granularity - 1)) != 0)
    r.fail("SIMCUDA_GRANULARITY", std::getenv("SIMCUDA_GRANULARITY"), "a power of two >= 4096");
  r.gbps("SIMCUDA_H2D_GBPS", &c.h2d_bytes_per_ns);
  r.gbps("SIMCUDA_D2H_GBPS", &c.d2h_bytes_per_ns);
  r.gbps("SIMCUDA_BIDIR_GBPS", &c.bidir_bytes_per_ns);
  r.gbps("SIMCUDA_HBM_GBPS", &c.hbm_bytes_per_ns);
  r.gbps("SIMCUDA_FAULT_GBPS", &c.fault_bytes_per_ns);
  r.gbps("SIMCUDA_HOST_CREATE_GBPS", &c.host_create_bytes_per_ns);
  r.uint("SIMCUDA_API_NS", &c.api_ns, 0, 1000000000);
  r.uint("SIMCUDA_LAUNCH_NS", &c.launch_ns, 0, 1000000000);
  r.ns("SIMCUDA_VMM_NS", &c.vmm_ns);
  r.call_ns("SIMCUDA_CALL_NS", &c);
  r.uint("SIMCUDA_JITTER", &c.jitter_seed, 0, UINT64_MAX);
  r.uint("SIMCUDA_JITTER_MAX_US", &c.jitter_max_us, 1, 1000000);
  r.flag("SIMCUDA_HOST_NUMA_VMM", &c.host_numa_vmm);
  r.flag("SIMCUDA_CONCURRENT_MANAGED", &c.concurrent_managed);
  r.flag("SIMCUDA_DATA", &c.move_data);
  r.flag("SIMCUDA_LOG", &c.log);
  if (const char* v = r.get("SIMCUDA_FAIL")) c.fail_spec = v;
  // A misspelt variable would silently leave a default in place: refuse it.
  static constexpr const char* kKnown[] = {"SIMCUDA_DEVICE_COUNT",
                                           "SIMCUDA_DEVICE_MEMORY",
                                           "SIMCUDA_HOST_MEMORY",
                                           "SIMCUDA_GRANULARITY",
                                           "SIMCUDA_H2D_GBPS",
                                           "SIMCUDA_D2H_GBPS",
                                           "SIMCUDA_BIDIR_GBPS",
                                           "SIMCUDA_HBM_GBPS",
                                           "SIMCUDA_API_NS",
                                           "SIMCUDA_LAUNCH_NS",
                                           "SIMCUDA_JITTER",
                                           "SIMCUDA_JITTER_MAX_US",
                                           "SIMCUDA_HOST_NUMA_VMM",
                                           "SIMCUDA_CONCURRENT_MANAGED",
                                           "SIMCUDA_LOG",
                                           "SIMCUDA_FAIL",
                                           "SIMCUDA_DATA",
                                           "SIMCUDA_FAULT_GBPS",
                                           "SIMCUDA_CALL_NS",
                                           "SIMCUDA_VMM_NS",
                                           "SIMCUDA_HOST_CREATE_GBPS"};
  for (char** e = environ; r.ok && e && *e; ++e) {
    if (std::strncmp(*e, "SIMCUDA_", 8) != 0) continue;
    std::string name(*e, std::strcspn(*e, "="));
    bool known = false;
    for (const char* k : kKnown) known = known || name == k;
    if (!known) {
      r.ok = false;
      *error =
          "simcuda: unknown variable " + shown(name) + " (see docs/sim.md for the SIMCUDA_* list)";
    }
  }
  if (!r.ok) return std::nullopt;
  return c;
}

}  // namespace sim
