// The replayer's command line and JSON look-ups (args.h), out of main.cpp:
// main() prints what bad_usage printed and exits as it did.
#include "args.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "size.h"

namespace replay {

std::optional<uint64_t> parse_size(const std::string& s) {
  // The shim's parser (base/size.h), so that a size means the same to every
  // tool; a size here is at least a byte.
  const std::optional<uint64_t> n = spillway::parse_bytes(s);
  if (!n || *n == 0) return std::nullopt;
  return n;
}

Args parse_args(int argc, const char* const* argv) {
  Args r;
  Options& o = r.options;
  auto bad = [&](std::string why) {
    r.action = Args::Action::kBad;
    r.error = std::move(why);
    return r;
  };
  // The value after argv[i] (i moves onto it), or nullopt with the error set.
  auto value = [&](int& i) -> std::optional<std::string> {
    if (i + 1 >= argc) {
      bad(std::string(argv[i]) + " needs a value");
      return std::nullopt;
    }
    return std::string(argv[++i]);
  };
  auto integer = [&](int& i, int64_t min, int64_t max = INT64_MAX) -> std::optional<int64_t> {
    const std::string flag = argv[i];
    const auto v = value(i);
    if (!v) return std::nullopt;
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(v->c_str(), &end, 10);
    if (v->empty() || *end || n < min || n > max || errno == ERANGE) {
      bad(flag + " '" + *v + "' is not an integer " +
          (max == INT64_MAX ? ">= " + std::to_string(min)
                            : "from " + std::to_string(min) + " to " + std::to_string(max)));
      return std::nullopt;
    }
    return static_cast<int64_t>(n);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      r.action = Args::Action::kHelp;
      return r;
    } else if (a == "--version") {
      r.action = Args::Action::kVersion;
      return r;
    } else if (a == "--budget") {
      const auto v = value(i);
      if (!v) return r;
      o.budget = *v;
      if (o.budget.empty()) return bad("--budget is empty");
    } else if (a == "--device-memory") {
      const auto v = value(i);
      if (!v) return r;
      auto n = parse_size(*v);
      if (!n) return bad("--device-memory '" + *v + "' is not a size such as 80GiB");
      o.device_memory = *n;
    } else if (a == "--mode") {
      const auto v = value(i);
      if (!v) return r;
      o.mode = *v;
      if (o.mode != "host" && o.mode != "managed" && o.mode != "off")
        return bad("--mode '" + *v + "' is not host, managed or off");
    } else if (a == "--strategy") {
      const auto v = value(i);
      if (!v) return r;
      if (*v == "spillway")
        o.strategy = Strategy::kSpillway;
      else if (*v == "none")
        o.strategy = Strategy::kNone;
      else if (*v == "save_on_cpu")
        o.strategy = Strategy::kSaveOnCpu;
      else if (*v == "torchtune")
        o.strategy = Strategy::kTorchtune;
      else if (*v == "layerwise")
        o.strategy = Strategy::kLayerwise;
      else
        return bad("--strategy '" + *v +
                   "' is not spillway, none, save_on_cpu, torchtune or layerwise");
    } else if (a == "--steps") {
      const auto n = integer(i, 0);
      if (!n) return r;
      o.steps = *n;
    } else if (a == "--json") {
      const auto v = value(i);
      if (!v) return r;
      o.json_out = *v;
    } else if (a == "--trace-out") {
      const auto v = value(i);
      if (!v) return r;
      o.trace_out = *v;
    } else if (a == "--no-data") {
      o.no_data = true;
    } else if (a == "--layers") {
      // An int, and no more than the analysis cuts a forward into.
      const auto n = integer(i, 1, kMaxLayers);
      if (!n) return r;
      o.layers = static_cast<int>(*n);
    } else if (a == "--offload-layers") {
      const auto n = integer(i, 0, kMaxLayers);
      if (!n) return r;
      o.offload_layers = static_cast<int>(*n);
    } else if (a == "--shim") {
      const auto v = value(i);
      if (!v) return r;
      o.shim = *v;
    } else if (a == "--inject-corruption") {  // test seam, not in the usage
      const auto n = integer(i, 0);
      if (!n) return r;
      o.inject_corruption = *n;
    } else if (a == "--baseline-child") {  // internal
      o.baseline_child = true;
    } else if (a == "--quiet") {  // internal
      o.quiet = true;
    } else if (!a.empty() && a[0] == '-') {
      return bad("unknown option " + a);
    } else if (o.trace.empty()) {
      o.trace = a;
    } else {
      return bad("more than one trace given");
    }
  }
  if (o.trace.empty()) return bad("no trace given");
  return r;
}

std::optional<uint64_t> parse_budget(const std::string& budget, uint64_t unconstrained_peak,
                                     std::string* error) {
  uint64_t bytes = 0;
  if (!budget.empty() && budget.back() == '%') {
    const std::string num = budget.substr(0, budget.size() - 1);
    char* end = nullptr;
    const double pct = std::strtod(num.c_str(), &end);
    if (num.empty() || *end || !(pct > 0) || pct > 100) {
      *error = "--budget '" + budget + "' is not a percentage in (0, 100]";
      return std::nullopt;
    }
    bytes = static_cast<uint64_t>(std::floor(static_cast<double>(unconstrained_peak) * pct / 100));
  } else {
    auto n = parse_size(budget);
    if (!n) {
      *error = "--budget '" + budget + "' is not a size such as 40GiB or a percentage";
      return std::nullopt;
    }
    bytes = *n;
  }
  if (bytes == 0) {
    *error = "--budget " + budget + " is 0 bytes";
    return std::nullopt;
  }
  return bytes;
}

uint64_t json_u64(const std::string& json, const std::string& key, uint64_t dflt) {
  const std::string k = "\"" + key + "\":";
  size_t p = json.find(k);
  if (p == std::string::npos) return dflt;
  p += k.size();
  while (p < json.size() && std::isspace(static_cast<unsigned char>(json[p]))) ++p;
  // Digits only: the double this once went through made "-1" or 1e30 an
  // out-of-range conversion (undefined behaviour).
  if (p == json.size() || !std::isdigit(static_cast<unsigned char>(json[p]))) return dflt;
  errno = 0;
  const unsigned long long v = std::strtoull(json.c_str() + p, nullptr, 10);
  return errno == ERANGE ? dflt : v;
}

std::vector<uint64_t> json_array(const std::string& json, const std::string& key) {
  std::vector<uint64_t> out;
  const std::string k = "\"" + key + "\":";
  size_t p = json.find(k);
  if (p == std::string::npos) return out;
  const char* c = json.c_str() + p + k.size();
  while (*c == ' ') ++c;
  if (*c++ != '[') return out;
  while (*c && *c != ']') {
    // strtoull would skip a sign or spaces, wrap "-1" and, on something that
    // is not a number, move nowhere: that looped forever, growing `out`.
    if (!std::isdigit(static_cast<unsigned char>(*c))) break;
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(c, &end, 10);
    if (errno == ERANGE) break;
    out.push_back(v);
    c = end;
    while (*c == ',' || *c == ' ') ++c;
  }
  return out;
}

}  // namespace replay
