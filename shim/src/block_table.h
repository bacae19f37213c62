// Address to block: which block a pointer (or any interior address of a
// large block) belongs to, for frees, the tracker's touches and pins. Also
// owns every Block object (recycled, never freed while the allocator lives).
//
// Large blocks in the VA arena are found in O(1) by granule; blocks outside
// it (managed allocations, design.md 4.2) in an ordered map; small blocks by
// their exact start address among the live ones.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "access.h"
#include "block.h"
#include "vmm.h"

namespace spillway {

class BlockTable {
 public:
  // `arena` must be reserved already; `granule` divides its size.
  void init(const VaArena& arena, size_t granule);

  Block* make();  // a blank block, recycled if one is spare
  // A new large block owning [ptr, ptr + cap), placed.
  Block* make_large(uintptr_t ptr, size_t cap, CUstream stream);
  void recycle(Block* b);  // no longer in use (its memory given back): blanked
  // Every block ever made (spare ones are blank: not large, not live).
  const std::vector<std::unique_ptr<Block>>& all() const { return blocks_; }

  // A large block's range is its own from place() to forget().
  void place(Block* b);
  void forget(Block* b);
  // Live blocks by exact pointer.
  void add_live(Block* b) { live_[b->ptr] = b; }
  void remove_live(Block* b) { live_.erase(b->ptr); }
  Block* live_at(uintptr_t p) const;
  const std::unordered_map<uintptr_t, Block*>& live() const { return live_; }
  // A split block's allocations other than one at its start (those are
  // live_at): allocation address -> block.
  void add_part(uintptr_t p, Block* b) { parts_[p] = b; }
  void remove_part(uintptr_t p) { parts_.erase(p); }
  Block* part_at(uintptr_t p) const {
    auto it = parts_.find(p);
    return it == parts_.end() ? nullptr : it->second;
  }

  // The live or cached block containing `p` (large: any interior address).
  Block* owner_of(uintptr_t p) const;
  // Calls `large` for each live large block under the range, `small` for a
  // live small block starting at its first byte.
  template <class Large, class Small>
  void for_each_block(const Touch& t, Large&& large, Small&& small) const;
  // The large blocks alone, with no look-up of a small one (they are never
  // held or moved): what a release at a launch's exit needs. Returns false
  // if the range is in the arena and on no large block (it may start a
  // small one).
  template <class Large>
  bool for_each_large(const Touch& t, Large&& large) const;

  // Lock-free, for the tracker's scan of every argument word.
  bool may_own(uintptr_t p) const {
    return in_arena(p) || (p >= outside_lo_.load(std::memory_order_relaxed) &&
                           p < outside_hi_.load(std::memory_order_relaxed));
  }
  void envelope(uintptr_t* lo, uintptr_t* hi) const;
  // Blocks outside the arena, by address (managed ones).
  const std::map<uintptr_t, Block*>& outside() const { return outside_; }

 private:
  bool in_arena(uintptr_t p) const { return p - arena_base_ < arena_size_; }
  Block* outside_at(uintptr_t p) const;

  uintptr_t arena_base_ = 0;
  size_t arena_size_ = 0, granule_ = 1;
  std::vector<Block*> owners_;  // large block owning each granule of the arena
  std::map<uintptr_t, Block*> outside_;
  // The span blocks outside the arena have covered: only ever widened, so
  // the tracker's cheap filter may pass a few addresses that are no longer
  // ours, never miss one that is.
  std::atomic<uintptr_t> outside_lo_{UINTPTR_MAX}, outside_hi_{0};
  std::unordered_map<uintptr_t, Block*> live_;
  std::unordered_map<uintptr_t, Block*> parts_;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<Block*> spare_;
};

template <class Large>
bool BlockTable::for_each_large(const Touch& t, Large&& large) const {
  if (!in_arena(t.lo)) {
    // Blocks outside the arena: every one the range overlaps.
    auto it = outside_.upper_bound(t.lo);
    if (it != outside_.begin()) --it;
    for (; it != outside_.end() && it->first < t.hi; ++it)
      if (it->first + it->second->cap > t.lo && it->second->live) large(it->second);
    return true;
  }
  // Large blocks: every block any granule of the range belongs to.
  const size_t first = (t.lo - arena_base_) / granule_;
  const size_t last =
      (std::min<uintptr_t>(t.hi, arena_base_ + arena_size_) - 1 - arena_base_) / granule_;
  bool any = false;
  for (size_t g = first; g <= last; ++g) {
    Block* b = owners_[g];
    if (!b) continue;
    any = true;
    if (b->live) large(b);
    g = (b->ptr + b->cap - arena_base_) / granule_ - 1;  // skip to its end
  }
  return any;
}

template <class Large, class Small>
void BlockTable::for_each_block(const Touch& t, Large&& large, Small&& small) const {
  // Small blocks: known by their start address only.
  if (!for_each_large(t, large))
    if (Block* b = live_at(t.lo)) small(b);
}

}  // namespace spillway
