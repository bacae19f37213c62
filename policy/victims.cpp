#include "victims.h"

#include <algorithm>

namespace spillway::policy {

std::vector<uint64_t> LruChooser::choose(std::vector<Candidate> c, size_t need) {
  std::sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) {
    return a.last_use != b.last_use ? a.last_use < b.last_use : a.id < b.id;
  });
  std::vector<uint64_t> out;
  size_t freed = 0;
  for (const Candidate& x : c) {
    if (freed >= need) break;
    out.push_back(x.id);
    freed += x.bytes;
  }
  return out;
}

}  // namespace spillway::policy
