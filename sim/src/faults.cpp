#include "faults.h"

#include "config.h"

#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

namespace sim::faults {
namespace {

struct Rule {
  std::string name;
  uint64_t nth;
  bool and_after;
  CUresult error;
  uint64_t seen = 0;
};

struct Faults {
  std::mutex mu;
  std::unordered_map<std::string, uint64_t> calls;  // by exported name
  std::vector<Rule> rules;
};

Faults& F() {
  static Faults* f = new Faults;
  return *f;
}

bool allocates(std::string_view base) {
  static constexpr std::string_view kAlloc[] = {
      "cuMemCreate",       "cuMemAlloc",          "cuMemAllocHost",    "cuMemHostAlloc",
      "cuMemAllocManaged", "cuMemAddressReserve", "cuMemHostRegister", "cuMemMap"};
  for (auto a : kAlloc)
    if (a == base) return true;
  return false;
}

}  // namespace

bool matches(std::string_view rule, std::string_view exported) {
  return rule == exported || rule == base_name(exported);
}

std::string_view base_name(std::string_view n) {
  for (std::string_view suffix : {"_ptsz", "_ptds"})
    if (n.size() > suffix.size() && n.substr(n.size() - suffix.size()) == suffix)
      n.remove_suffix(suffix.size());
  // Version suffix: _v2, _v3, ...
  size_t us = n.rfind("_v");
  if (us != std::string_view::npos && us + 2 < n.size()) {
    bool digits = true;
    for (size_t i = us + 2; i < n.size(); ++i) digits = digits && n[i] >= '0' && n[i] <= '9';
    if (digits) n = n.substr(0, us);
  }
  return n;
}

bool add(std::string_view name, uint64_t nth, bool and_after, CUresult error) {
  if (name.empty() || nth == 0) return false;
  Faults& f = F();
  std::lock_guard lk(f.mu);
  f.rules.push_back(Rule{std::string(name), nth, and_after, error});
  return true;
}

void clear() {
  Faults& f = F();
  std::lock_guard lk(f.mu);
  f.rules.clear();
}

bool configure(const std::string& spec, std::string* error) {
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string item =
        spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? spec.size() : comma + 1;
    auto bad = [&](const char* why) {
      *error =
          "simcuda: SIMCUDA_FAIL='" + shown(spec) + "': item '" + shown(item) + "' " + why +
          "; accepted: name:n[+][:CUDA_ERROR_X],... e.g. cuMemCreate:3,cuMemcpyDtoHAsync_v2:10+";
      return false;
    };
    size_t c1 = item.find(':');
    if (c1 == std::string::npos || c1 == 0) return bad("has no name:n");
    std::string name = item.substr(0, c1);
    size_t c2 = item.find(':', c1 + 1);
    std::string count =
        item.substr(c1 + 1, c2 == std::string::npos ? std::string::npos : c2 - c1 - 1);
    bool and_after = !count.empty() && count.back() == '+';
    if (and_after) count.pop_back();
    const std::optional<uint64_t> n = parse_uint(count);
    if (!n || *n == 0) return bad("has no call number from 1 to 2^64-1");
    CUresult err = allocates(base_name(name)) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_VALUE;
    if (c2 != std::string::npos && !errors::from_name(item.substr(c2 + 1), &err))
      return bad("names an unknown CUresult");
    add(name, *n, and_after, err);
  }
  return true;
}

CUresult on_call(const char* exported) {
  Faults& f = F();
  std::lock_guard lk(f.mu);
  ++f.calls[exported];
  CUresult result = CUDA_SUCCESS;
  for (Rule& r : f.rules) {
    if (!matches(r.name, exported)) continue;
    ++r.seen;
    if (r.seen == r.nth || (r.and_after && r.seen > r.nth)) result = r.error;
  }
  return result;
}

uint64_t count(std::string_view name) {
  Faults& f = F();
  std::lock_guard lk(f.mu);
  uint64_t total = 0;
  for (const auto& [exported, n] : f.calls)
    if (exported == name || base_name(exported) == name) total += n;
  return total;
}

}  // namespace sim::faults
