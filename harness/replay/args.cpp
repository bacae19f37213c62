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

#include <functional>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "size.h"

namespace replay {

std::optional<uint64_t> parse_size(const std::string& s) {
  // The shim's parser (base/size.h), so that a size means the same to every
  // tool; a size here is at least a byte.
  const std::optional<uint64_t> n = spillway::parse_bytes(s);
  if (!n || *n == 0) return std::nullopt;
  return n;
}

namespace {

// A value refused by name: the first one on the command line ends the
// reading (each option's check runs as it is read).
struct Refused {
  std::string why;
};

constexpr const char* kHelpText =
    "Replays a .spwt record through libspillway.so on the simulated GPU. Every time it "
    "reports is SIMULATED time (the sim's virtual clock). SIZE: 40GiB, 512MiB, 1.5GB, 4096 "
    "(bytes); PCT: a percentage of the record's unconstrained peak, e.g. 60%. harness/README.md "
    "has the report's fields.";

int64_t integer(const std::string& flag, const std::string& v, int64_t min,
                int64_t max = INT64_MAX) {
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end || n < min || n > max || errno == ERANGE)
    throw Refused{flag + " '" + v + "' is not an integer " +
                  (max == INT64_MAX
                       ? ">= " + std::to_string(min)
                       : "from " + std::to_string(min) + " to " + std::to_string(max))};
  return static_cast<int64_t>(n);
}

Strategy strategy(const std::string& v) {
  if (v == "spillway") return Strategy::kSpillway;
  if (v == "none") return Strategy::kNone;
  if (v == "save_on_cpu") return Strategy::kSaveOnCpu;
  if (v == "torchtune") return Strategy::kTorchtune;
  if (v == "layerwise") return Strategy::kLayerwise;
  throw Refused{"--strategy '" + v +
                "' is not spillway, none, save_on_cpu, torchtune or layerwise"};
}

}  // namespace

Args parse_args(int argc, const char* const* argv) {
  Args r;
  Options& o = r.options;
  CLI::App app(kHelpText, "spillway-replay");
  // --help and --version are found before the options are read, so that
  // they win wherever they are; here for the help text.
  app.set_help_flag("-h,--help", "this text, and nothing else is done");
  app.allow_extras();  // a second record or an unknown option: refused below, by name
  std::string record;
  // Each option's check runs as it is read, in the command line's order.
  auto text = [&](const char* name, std::string* to, const char* type, const char* help,
                  std::function<void(const std::string&)> check = {}) {
    return app
        .add_option_function<std::string>(
            name,
            [to, check](const std::string& v) {
              if (check) check(v);
              if (to) *to = v;
            },
            help)
        ->type_name(type)
        ->trigger_on_parse();
  };
  app.add_flag("--version")->description("the version, and nothing else is done");
  text("--budget", &o.budget, "SIZE|PCT%",
       "spillway's GPU budget (SPILLWAY_GPU_BUDGET), and the simulated device's memory "
       "unless --device-memory: a size, or a percentage of the record's unconstrained peak",
       [](const std::string& v) {
         if (v.empty()) throw Refused{"--budget is empty"};
       });
  text("--device-memory", nullptr, "SIZE",
       "the simulated device's memory, when it differs from the budget", [&](const std::string& v) {
         const auto n = parse_size(v);
         if (!n) throw Refused{"--device-memory '" + v + "' is not a size such as 80GiB"};
         o.device_memory = *n;
       });
  text("--mode", &o.mode, "host|managed|off", "spillway's mode (SPILLWAY_MODE)",
       [](const std::string& v) {
         if (v != "host" && v != "managed" && v != "off")
           throw Refused{"--mode '" + v + "' is not host, managed or off"};
       });
  text("--strategy", nullptr, "spillway|none|save_on_cpu|torchtune|layerwise",
       "what manages memory: spillway (default), none (the plain allocator), or an anchor "
       "strategy replayed from the record's layers",
       [&](const std::string& v) { o.strategy = strategy(v); });
  text("--steps", nullptr, "N", "replay the first N steps only (0: all)",
       [&](const std::string& v) {
         const int64_t n = integer("--steps", v, 0);
         o.steps = n == 0 ? -1 : n;  // replay.h: -1 is every step
       });
  text("--devices", nullptr, "N",
       "replay the record on N simulated devices at once (1-8), one thread each, as a "
       "one-process data-parallel job; the budget is each device's",
       [&](const std::string& v) { o.devices = static_cast<int>(integer("--devices", v, 1, 8)); });
  text("--step-sync", nullptr, "streams|context",
       "what a step's end waits for: the record's streams (default; as loss.item() does) or "
       "every stream of the context, spillway's copies too (as torch.cuda.synchronize())",
       [&](const std::string& v) {
         if (v != "streams" && v != "context")
           throw Refused{"--step-sync '" + v + "' is not streams or context"};
         o.step_sync_context = v == "context";
       });
  text("--json", &o.json_out, "OUT", "write the report (JSON; harness/README.md) to OUT");
  text("--trace-out", &o.trace_out, "OUT",
       "write a Chrome/Perfetto trace of kernels and transfers to OUT");
  app.add_flag("--no-data", o.no_data,
               "accounting mode: the simulator moves no byte and integrity is not checked "
               "(for records larger than this machine's memory)");
  text("--layers", nullptr, "N", "the layers the anchor strategies cut a forward into",
       [&](const std::string& v) {
         o.layers = static_cast<int>(integer("--layers", v, 1, kMaxLayers));
       });
  text("--offload-layers", nullptr, "K", "layers the layerwise strategy offloads",
       [&](const std::string& v) {
         o.offload_layers = static_cast<int>(integer("--offload-layers", v, 0, kMaxLayers));
       });
  text("--shim", &o.shim, "PATH", "the libspillway.so to replay (default: this build's)");
  // Internal and test seams: not in the help.
  text("--inject-corruption", nullptr, "N", "", [&](const std::string& v) {
    o.inject_corruption = integer("--inject-corruption", v, 0);
  })->group("");
  app.add_flag("--baseline-child", o.baseline_child)->group("");
  app.add_flag("--quiet", o.quiet)->group("");
  app.add_option("RECORD", record, "the .spwt record to replay (harness/record.py)");
  r.help = app.help();

  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      r.action = Args::Action::kHelp;
      return r;
    }
    if (a == "--version") {
      r.action = Args::Action::kVersion;
      return r;
    }
  }
  auto bad = [&](std::string why) {
    r.action = Args::Action::kBad;
    r.error = std::move(why);
    return r;
  };
  try {
    app.parse(argc, argv);
  } catch (const Refused& e) {
    return bad(e.why);
  } catch (const CLI::ArgumentMismatch& e) {
    // "--json: 1 required TEXT missing": the option named first.
    const std::string what = e.what();
    return bad(what.substr(0, what.find(':')) + " needs a value");
  } catch (const CLI::ParseError& e) {
    return bad(e.what());
  }
  for (const std::string& extra : app.remaining()) {
    if (!extra.empty() && extra[0] == '-') return bad("unknown option " + extra);
    return bad("more than one record given");
  }
  if (record.empty()) return bad("no record given");
  o.trace = record;
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

namespace {

// The top-level object of `json`, or a null value when it is not one.
nlohmann::json object_of(const std::string& json) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : nlohmann::json();
}

}  // namespace

uint64_t json_u64(const std::string& json, const std::string& key, uint64_t dflt) {
  const nlohmann::json j = object_of(json);
  if (!j.is_object()) return dflt;
  const auto it = j.find(key);
  // An unsigned integer only: -1, 1e30 or 99999999999999999999 (a float to
  // the parser) are not a count of bytes or nanoseconds.
  return it != j.end() && it->is_number_unsigned() ? it->get<uint64_t>() : dflt;
}

std::vector<uint64_t> json_array(const std::string& json, const std::string& key) {
  std::vector<uint64_t> out;
  const nlohmann::json j = object_of(json);
  if (!j.is_object()) return out;
  const auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return out;
  for (const nlohmann::json& v : *it) {
    if (!v.is_number_unsigned()) break;
    out.push_back(v.get<uint64_t>());
  }
  return out;
}

}  // namespace replay
