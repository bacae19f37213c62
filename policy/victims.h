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

// One access the tracker saw, as the policy gets it (design.md 7: a learned
// schedule needs which block, on which stream, at which launch, by which
// kernel).
struct Access {
  uint64_t block;      // the allocator's handle for the block
  size_t bytes;        // its size
  uint64_t stream;     // an opaque stream identity
  uint64_t launch;     // the launch, copy or set's sequence number
  const char* kernel;  // its kernel's name, or null (copies, sets, unknown)
};

class VictimChooser {
 public:
  virtual ~VictimChooser() = default;
  // Every access to a block that may be evicted, in launch order, before the
  // work is queued. LRU needs none of it (the allocator keeps its ticks).
  virtual void on_access(const Access&) {}
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
