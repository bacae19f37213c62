#include "victims.h"

#include <algorithm>

namespace spillway::policy {

bool used_earlier(const Candidate& a, const Candidate& b) {
  return a.last_use != b.last_use ? a.last_use < b.last_use : a.id < b.id;
}

std::vector<uint64_t> first_covering(const std::vector<Candidate>& ordered, size_t need) {
  std::vector<uint64_t> out;
  size_t freed = 0;
  for (const Candidate& x : ordered) {
    if (freed >= need) break;
    out.push_back(x.id);
    freed += x.bytes;
  }
  return out;
}

std::vector<uint64_t> LruChooser::choose(std::vector<Candidate> c, size_t need) {
  std::sort(c.begin(), c.end(), used_earlier);
  return first_covering(c, need);
}

}  // namespace spillway::policy
