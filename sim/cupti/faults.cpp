#include "faults.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "names.h"

namespace simcupti {
namespace {

struct Rule {
  std::string name;
  uint64_t nth = 0;
  bool and_after = false;
  CUptiResult error = CUPTI_ERROR_UNKNOWN;
};

struct State {
  std::mutex mu;
  std::vector<Rule> rules;
  std::map<std::string, uint64_t> calls;
};

[[noreturn]] void bad_spec(const std::string& spec, const std::string& item, const char* why) {
  std::fprintf(stderr,
               "simcupti: SIMCUPTI_FAIL='%s': item '%s' %s; expected name:n[+][:CUPTI_ERROR_X], "
               "comma-separated (docs/sim.md)\n",
               spec.c_str(), item.c_str(), why);
  std::fflush(stderr);
  _exit(2);
}

std::vector<Rule> parse(const std::string& spec) {
  std::vector<Rule> rules;
  size_t start = 0;
  while (start <= spec.size()) {
    const size_t comma = spec.find(',', start);
    const std::string item =
        spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? spec.size() + 1 : comma + 1;
    if (item.empty()) continue;
    Rule r;
    const size_t c1 = item.find(':');
    if (c1 == std::string::npos || c1 == 0) bad_spec(spec, item, "has no name:n");
    r.name = item.substr(0, c1);
    if (r.name.rfind("cupti", 0) != 0) bad_spec(spec, item, "does not name a cupti* entry point");
    const size_t c2 = item.find(':', c1 + 1);
    std::string n = item.substr(c1 + 1, c2 == std::string::npos ? std::string::npos : c2 - c1 - 1);
    if (!n.empty() && n.back() == '+') {
      r.and_after = true;
      n.pop_back();
    }
    if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos || n.size() > 18)
      bad_spec(spec, item, "has a call number that is not a whole number");
    r.nth = std::strtoull(n.c_str(), nullptr, 10);
    if (r.nth == 0) bad_spec(spec, item, "has call number 0 (calls count from 1)");
    if (c2 != std::string::npos) {
      const std::string e = item.substr(c2 + 1);
      bool found = false;
      for (const IdName& in : result_names())
        if (e == in.name && in.id != CUPTI_SUCCESS) {
          r.error = static_cast<CUptiResult>(in.id);
          found = true;
        }
      if (!found) bad_spec(spec, item, "names no CUPTI error of cupti_result.h");
    }
    rules.push_back(r);
  }
  return rules;
}

State& state() {
  static State* s = [] {
    auto* st = new State;
    if (const char* v = std::getenv("SIMCUPTI_FAIL")) st->rules = parse(v);
    return st;
  }();
  return *s;
}

}  // namespace

CUptiResult injected(const char* name) {
  State& s = state();
  // Without SIMCUPTI_FAIL nothing is counted: cuptiActivityGetNextRecord is
  // called once per record.
  if (s.rules.empty()) return CUPTI_SUCCESS;
  std::lock_guard lock(s.mu);
  const uint64_t n = ++s.calls[name];
  for (const Rule& r : s.rules) {
    if (r.name != name || !(n == r.nth || (r.and_after && n > r.nth))) continue;
    const char* e = find_name(result_names(), static_cast<uint32_t>(r.error));
    std::fprintf(stderr, "simcupti: %s call %llu: injected failure %s (SIMCUPTI_FAIL)\n", name,
                 static_cast<unsigned long long>(n), e ? e : "?");
    return r.error;
  }
  return CUPTI_SUCCESS;
}

}  // namespace simcupti
