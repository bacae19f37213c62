// Which resident blocks to evict. A pure decision over what the allocator
// reports: no CUDA, no threads, no I/O. Until access tracking exists the only
// signal is the allocation/free order, so the default is least recently used;
// the learned schedule of design.md section 7 will implement the same
// interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace spillway::policy {

struct Candidate {
  uint64_t id;        // the allocator's handle for the block
  size_t bytes;       // device bytes freed by evicting it
  uint64_t last_use;  // a monotonic tick; smaller is older
};

class VictimChooser {
 public:
  virtual ~VictimChooser() = default;
  // Picks blocks whose eviction frees at least `need` bytes, in the order to
  // evict them; fewer if the candidates do not add up to `need`.
  virtual std::vector<uint64_t> choose(std::vector<Candidate> candidates, size_t need) = 0;
};

// Least recently used first.
class LruChooser final : public VictimChooser {
 public:
  std::vector<uint64_t> choose(std::vector<Candidate> candidates, size_t need) override;
};

}  // namespace spillway::policy
