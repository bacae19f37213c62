#include "block_table.h"

#include <algorithm>

namespace spillway {

void BlockTable::init(const VaArena& arena, size_t granule) {
  arena_base_ = arena.base();
  arena_size_ = arena.size();
  granule_ = granule;
  owners_.assign(arena_size_ / granule_, nullptr);
}

Block* BlockTable::make() {
  if (!spare_.empty()) {
    Block* b = spare_.back();
    spare_.pop_back();
    return b;
  }
  blocks_.push_back(std::make_unique<Block>());
  return blocks_.back().get();
}

Block* BlockTable::make_large(uintptr_t ptr, size_t cap, CUstream stream) {
  Block* b = make();
  b->ptr = ptr;
  b->cap = cap;
  b->large = true;
  b->stream = stream;
  place(b);
  return b;
}

void BlockTable::recycle(Block* b) {
  *b = Block{};
  spare_.push_back(b);
}

void BlockTable::place(Block* b) {
  if (!in_arena(b->ptr)) {
    outside_[b->ptr] = b;
    uintptr_t lo = outside_lo_.load(std::memory_order_relaxed);
    while (b->ptr < lo && !outside_lo_.compare_exchange_weak(lo, b->ptr)) {
    }
    uintptr_t hi = outside_hi_.load(std::memory_order_relaxed);
    while (b->ptr + b->cap > hi && !outside_hi_.compare_exchange_weak(hi, b->ptr + b->cap)) {
    }
    return;
  }
  const size_t first = (b->ptr - arena_base_) / granule_;
  for (size_t i = 0; i < b->cap / granule_; ++i) owners_[first + i] = b;
}

void BlockTable::forget(Block* b) {
  if (!in_arena(b->ptr)) {
    outside_.erase(b->ptr);
    return;
  }
  const size_t first = (b->ptr - arena_base_) / granule_;
  for (size_t i = 0; i < b->cap / granule_; ++i) owners_[first + i] = nullptr;
}

Block* BlockTable::live_at(uintptr_t p) const {
  auto it = live_.find(p);
  return it == live_.end() ? nullptr : it->second;
}

Block* BlockTable::outside_at(uintptr_t p) const {
  auto it = outside_.upper_bound(p);
  if (it == outside_.begin()) return nullptr;
  --it;
  return p - it->first < it->second->cap ? it->second : nullptr;
}

Block* BlockTable::owner_of(uintptr_t p) const {
  if (in_arena(p)) {
    if (Block* b = owners_[(p - arena_base_) / granule_]) return b;
  } else if (Block* b = outside_at(p)) {
    return b;
  }
  return live_at(p);  // small blocks: exact pointers only
}

void BlockTable::envelope(uintptr_t* lo, uintptr_t* hi) const {
  *lo = std::min<uintptr_t>(arena_base_, outside_lo_.load(std::memory_order_relaxed));
  *hi = std::max<uintptr_t>(arena_base_ + arena_size_, outside_hi_.load(std::memory_order_relaxed));
}

}  // namespace spillway
