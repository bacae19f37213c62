// Which resident blocks to evict. A pure decision over what the allocator reports: no CUDA, no
// threads (the allocator calls under its lock), no I/O. LruChooser here;
// the learned schedule of design.md section 7 in schedule.h.
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
struct Use {
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
  virtual void on_access(const Use&) {}
  // A block that may be evicted is allocated or freed; a training step ends
  // (spillway_mark_step).
  virtual void on_alloc(uint64_t /*id*/) {}
  virtual void on_free(uint64_t /*id*/) {}
  // `end`: the number (Use::launch) of the step's last launch, copy or set.
  virtual void on_step(uint64_t /*end*/) {}
  // Picks blocks whose eviction frees at least `need` bytes, in the order to
  // evict them; fewer if the candidates do not add up to `need`.
  virtual std::vector<uint64_t> choose(std::vector<Candidate> candidates, size_t need) = 0;
  // Appends the live blocks predicted to be used within `ahead` launches of
  // the latest access, each named once as the window reaches its use: what
  // the allocator may prefetch. A chooser without predictions names none.
  virtual void upcoming(uint32_t /*ahead*/, std::vector<uint64_t>* /*ids*/) {}
  // As choose, but only blocks predicted to be used later than `beyond`
  // launches from now (room for a prefetch must not cost a sooner use).
  // A chooser without predictions picks none.
  virtual std::vector<uint64_t> choose_beyond(std::vector<Candidate> /*candidates*/,
                                              size_t /*need*/, uint64_t /*beyond*/) {
    return {};
  }
};

// Older use first (ties by id): least recent use's order, and the schedule's
// among equally distant blocks.
bool used_earlier(const Candidate& a, const Candidate& b);
// The ids of the first of `ordered` whose bytes add up to `need` (all of them
// if they do not).
std::vector<uint64_t> first_covering(const std::vector<Candidate>& ordered, size_t need);

// Least recently used first.
class LruChooser final : public VictimChooser {
 public:
  std::vector<uint64_t> choose(std::vector<Candidate> candidates, size_t need) override;
};

}  // namespace spillway::policy
