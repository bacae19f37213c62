// Fuzz target: spillway-replay's command line and the JSON it reads back
// (harness/replay/args.*). The input is read two ways:
// - as arguments: split at each NUL (argv[0] is the program), handed to
//   parse_args(), then the --budget it holds to parse_budget() as main()
//   does, and each argument to parse_size();
// - as the JSON report of a baseline child (or the shim's statistics): the
//   numbers main() takes from it (json_u64, json_array).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "args.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);

  std::vector<std::string> args{"spillway-replay"};
  std::string cur;
  for (char ch : text) {
    if (ch == '\0') {
      args.push_back(std::move(cur));
      cur.clear();
    } else {
      cur += ch;
    }
  }
  if (!cur.empty()) args.push_back(std::move(cur));
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);

  const replay::Args r = replay::parse_args(static_cast<int>(args.size()), argv.data());
  if (r.action == replay::Args::Action::kBad) {
    FUZZ_CHECK(!r.error.empty(), "a refusal without a reason");
  } else if (r.action == replay::Args::Action::kRun) {
    const replay::Options& o = r.options;
    FUZZ_CHECK(!o.trace.empty(), "no trace");
    FUZZ_CHECK(o.layers >= 0 && o.offload_layers >= -1 && o.steps >= -1,
               "layers %d, offload layers %d, steps %lld", o.layers, o.offload_layers,
               static_cast<long long>(o.steps));
    if (!o.budget.empty()) {
      std::string error;
      for (const uint64_t peak : {uint64_t{0}, uint64_t{1} << 30, UINT64_MAX}) {
        const auto b = replay::parse_budget(o.budget, peak, &error);
        FUZZ_CHECK(b || !error.empty(), "a refused budget without a reason");
        if (b) FUZZ_CHECK(*b > 0, "a budget of 0 bytes");
      }
    }
  }
  for (const std::string& a : args) {
    const auto n = replay::parse_size(a);
    if (n) FUZZ_CHECK(*n >= 1, "'%s' is 0 bytes", a.c_str());
  }

  // main(): run_baseline() and the report's budget.
  uint64_t sum = replay::json_u64(text, "peak_device_bytes") +
                 replay::json_u64(text, "sim_step_time_ns") +
                 replay::json_u64(text, "budget_bytes");
  for (const uint64_t v : replay::json_array(text, "step_times_ns")) sum += v;
  volatile uint64_t sink = sum;
  (void)sink;
  return 0;
}
