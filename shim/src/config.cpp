#include "config.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace spillway {
namespace {

constexpr const char* kSizeForms =
    "a size such as 40GiB, 512MiB, 1.5GB or 1073741824 (bytes), or a percentage such as 85% "
    "(0.0001% to 100%)";

struct Variable {
  const char* name;
  // Returns an empty string on success, else the accepted forms.
  std::string (*apply)(const std::string& value, Config* c);
};

std::string set_mode(const std::string& v, Config* c) {
  if (v == "host")
    c->mode = Mode::kHost;
  else if (v == "off")
    c->mode = Mode::kOff;
  else if (v == "managed")
    c->mode = Mode::kManaged;
  else
    return "host, managed or off";
  return {};
}

std::string set_gpu_budget(const std::string& v, Config* c) {
  auto s = parse_size_or_percent(v);
  if (!s || (s->fraction == 0 && s->bytes == 0)) return kSizeForms;
  c->gpu_budget = *s;
  return {};
}

std::string set_host_budget(const std::string& v, Config* c) {
  auto s = parse_size_or_percent(v);
  if (!s) return kSizeForms;
  if (s->fraction == 0 && s->bytes == 0)
    return std::string(kSizeForms) +
           ", greater than zero (to keep everything on the GPU, use SPILLWAY_MODE=off)";
  c->host_budget = *s;
  return {};
}

std::string set_host_reserve(const std::string& v, Config* c) {
  auto s = parse_size_or_percent(v);
  if (!s) return std::string(kSizeForms) + " (a percentage is of the GPU budget; 0 for none)";
  c->host_reserve = *s;
  return {};
}

std::string set_min_block(const std::string& v, Config* c) {
  auto b = parse_bytes(v);
  // Below 4 KiB every block would need its own mapping; above 1 GiB nothing
  // would ever be evicted: both are mistakes rather than policies.
  if (!b || *b < 4096 || *b > (1ull << 30)) return "a size from 4KiB to 1GiB, e.g. 1MiB";
  c->min_block = *b;
  return {};
}

std::string set_policy(const std::string& v, Config* c) {
  if (v == "schedule")
    c->policy = Policy::kSchedule;
  else if (v == "lru")
    c->policy = Policy::kLru;
  else
    return "schedule (learn each step's accesses, evict the block used furthest ahead) or lru";
  return {};
}

std::string set_prefetch(const std::string& v, Config* c) {
  // A count of launches: digits only (no sign, no unit), up to a million.
  constexpr const char* kForms = "a number of launches from 0 (off) to 1000000, e.g. 64";
  if (v.empty() || v.size() > 7 || v.find_first_not_of("0123456789") != std::string::npos)
    return kForms;
  const unsigned long n = std::strtoul(v.c_str(), nullptr, 10);
  if (n > 1000000) return kForms;
  c->prefetch_launches = static_cast<uint32_t>(n);
  return {};
}

std::string set_log_level(const std::string& v, Config* c) {
  static constexpr std::pair<const char*, LogLevel> kLevels[] = {
      {"trace", LogLevel::kTrace}, {"debug", LogLevel::kDebug}, {"info", LogLevel::kInfo},
      {"warn", LogLevel::kWarn},   {"error", LogLevel::kError}, {"off", LogLevel::kOff}};
  for (const auto& [name, level] : kLevels) {
    if (v == name) {
      c->log_level = level;
      return {};
    }
  }
  return "trace, debug, info, warn, error or off";
}

std::string set_log_file(const std::string& v, Config* c) {
  if (v.empty()) return "a file path";
  c->log_file = v;
  return {};
}

std::string set_stats_file(const std::string& v, Config* c) {
  if (v.empty()) return "a file path";
  c->stats_file = v;
  return {};
}

std::string set_trace_file(const std::string& v, Config* c) {
  if (v.empty()) return "a file path (Chrome trace JSON)";
  c->trace_file = v;
  return {};
}

std::string set_record_file(const std::string& v, Config* c) {
  if (v.empty()) return "a file path (a .spwt record, docs/record-format.md)";
  c->record_file = v;
  return {};
}

// A switch spelled two ways: `yes` sets it, `no` clears it; anything else
// is refused with `forms`.
std::string set_switch(const std::string& v, const char* yes, const char* no, bool* out,
                       const char* forms) {
  if (v != yes && v != no) return forms;
  *out = v == yes;
  return {};
}

std::string set_stacks(const std::string& v, Config* c) {
  return set_switch(v, "1", "0", &c->stacks,
                    "1 (record the call site of each large allocation) or 0");
}

std::string set_plan(const std::string& v, Config* c) {
  return set_switch(v, "on", "off", &c->plan,
                    "on (plan each step's evictions and prefetches from the last) or off");
}

std::string set_cupti(const std::string& v, Config* c) {
  return set_switch(v, "auto", "off", &c->cupti,
                    "auto (track accesses through CUPTI when it can be had) or off");
}

std::string set_cupti_path(const std::string& v, Config* c) {
  if (v.empty()) return "a path to libcupti.so";
  c->cupti_path = v;
  return {};
}

const std::vector<Variable>& variables() {
  static const std::vector<Variable> kVars = {
      {"SPILLWAY_MODE", set_mode},
      {"SPILLWAY_GPU_BUDGET", set_gpu_budget},
      {"SPILLWAY_HOST_BUDGET", set_host_budget},
      {"SPILLWAY_HOST_RESERVE", set_host_reserve},
      {"SPILLWAY_MIN_BLOCK", set_min_block},
      {"SPILLWAY_POLICY", set_policy},
      {"SPILLWAY_PREFETCH", set_prefetch},
      {"SPILLWAY_LOG_LEVEL", set_log_level},
      {"SPILLWAY_LOG_FILE", set_log_file},
      {"SPILLWAY_STATS", set_stats_file},
      {"SPILLWAY_TRACE", set_trace_file},
      {"SPILLWAY_RECORD", set_record_file},
      {"SPILLWAY_STACKS", set_stacks},
      {"SPILLWAY_PLAN", set_plan},
      {"SPILLWAY_CUPTI", set_cupti},
      {"SPILLWAY_CUPTI_PATH", set_cupti_path},
  };
  return kVars;
}

}  // namespace

uint64_t default_gpu_budget(uint64_t total) {
  uint64_t headroom = std::max<uint64_t>(1ull << 30, total / 20);
  return total > headroom ? total - headroom : total / 2;
}

uint64_t default_host_budget(uint64_t host_total) {
  return host_total / 2;
}

// A plain decimal number at the start of `text` ("12", "1.5"): no sign, no
// space, no exponent, no hexadecimal. Returns the characters it used (0: none).
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::optional<Config> parse_config(char** env, std::string* error) {
  Config c;
  for (char** e = env; e && *e; ++e) {
    if (std::strncmp(*e, "SPILLWAY_", 9) != 0) continue;
    const char* eq = std::strchr(*e, '=');
    std::string name(*e, eq ? static_cast<size_t>(eq - *e) : std::strlen(*e));
    std::string value = eq ? eq + 1 : "";
    const Variable* var = nullptr;
    for (const Variable& v : variables())
      if (name == v.name) var = &v;
    if (!var) {
      std::string best;
      size_t best_d = 4;  // suggest only close names
      for (const Variable& v : variables()) {
        size_t d = edit_distance(name, v.name);
        if (d < best_d) {
          best_d = d;
          best = v.name;
        }
      }
      *error = "spillway: unknown variable " + name + "='" + value + "'" +
               (best.empty() ? std::string() : "; did you mean " + best + "?") +
               " (docs/config.md lists every SPILLWAY_ variable)";
      return std::nullopt;
    }
    std::string accepted = var->apply(value, &c);
    if (!accepted.empty()) {
      *error = "spillway: " + name + "='" + value + "' is not valid; accepted: " + accepted;
      return std::nullopt;
    }
  }
  for (std::string* path : {&c.log_file, &c.stats_file, &c.trace_file, &c.record_file})
    *path = expand_path(*path, env);
  return c;
}

namespace {

// RANK, else LOCAL_RANK (what torchrun sets), or null.
const char* rank_in(char** env) {
  auto get = [&](const char* name) -> const char* {
    const size_t n = std::strlen(name);
    for (char** e = env; e && *e; ++e)
      if (std::strncmp(*e, name, n) == 0 && (*e)[n] == '=') return *e + n + 1;
    return nullptr;
  };
  const char* rank = get("RANK");
  if (!rank || !*rank) rank = get("LOCAL_RANK");
  return rank && *rank ? rank : nullptr;
}

}  // namespace

std::string log_tag(char** env) {
  const char* rank = rank_in(env);
  if (!rank) return {};
  return std::string("rank ") + rank + " pid " + std::to_string(getpid());
}

std::string expand_path(const std::string& path, char** env) {
  const char* rank = rank_in(env);
  if (!rank) rank = "0";
  std::string out;
  for (size_t i = 0; i < path.size();) {
    if (path.compare(i, 6, "{rank}") == 0) {
      out += rank;
      i += 6;
    } else if (path.compare(i, 5, "{pid}") == 0) {
      out += std::to_string(getpid());
      i += 5;
    } else {
      out += path[i++];
    }
  }
  return out;
}

}  // namespace spillway
