// Virtual-memory mechanics on top of the driver table: one large VA
// reservation that every block's range is carved from (so "is this a
// spillway address?" is one range check), and pools of physical memory by
// exact size, device- or host-located. RAII: everything is returned to the
// driver in the destructors.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "driver.h"

namespace spillway {

// The free parts of an address interval: best-fit take, coalescing give.
// Serves both the VA arena (granule units) and small-block chunks.
class FreeRanges {
 public:
  void give(uintptr_t p, size_t n);
  uintptr_t take(size_t n);  // 0 if no range is large enough
  // The length of the range take(n) would carve from; 0 if none.
  size_t fit(size_t n) const {
    auto it = by_size_.lower_bound(n);
    return it == by_size_.end() ? 0 : it->first;
  }
  size_t free_bytes() const { return free_bytes_; }

 private:
  std::map<uintptr_t, size_t> by_addr_;
  std::multimap<size_t, uintptr_t> by_size_;
  size_t free_bytes_ = 0;
  void insert(uintptr_t p, size_t n);
  void erase(std::map<uintptr_t, size_t>::iterator it);
};

class VaArena {
 public:
  VaArena(const cu::Driver& d, size_t granule) : d_(d), granule_(granule) {}
  ~VaArena();
  VaArena(const VaArena&) = delete;
  VaArena& operator=(const VaArena&) = delete;

  // Reserves `bytes`, or as much less as the process can have, down to
  // `floor` (halving): a process's VA may be limited (ulimit -v, a
  // sanitizer's memory layout). Only the last refusal is logged.
  CUresult reserve(size_t bytes, size_t floor);
  // A granule-aligned range of `size` bytes (a granule multiple), or 0.
  uintptr_t take(size_t size) { return free_.take(size); }
  void give(uintptr_t ptr, size_t size) { free_.give(ptr, size); }
  bool contains(uintptr_t p) const { return p - base_ < size_; }
  size_t granule() const { return granule_; }
  uintptr_t base() const { return base_; }
  size_t size() const { return size_; }

 private:
  const cu::Driver& d_;
  size_t granule_;
  uintptr_t base_ = 0;
  size_t size_ = 0;
  FreeRanges free_;
};

// Physical memory of one kind (device- or host-located), pooled by exact size
// so that a repeated training step creates nothing new.
//
// A handle may be staged: mapped at an address of its own in `stage_in`,
// read/write for `device`, for as long as the pool holds it, pooled or taken.
// A copy into or out of the handle then needs no map and unmap (2-3 VMM
// calls, about 45 us each on an H100, docs/gpu.md check (a)) on the thread
// that queues it. A physical allocation may be mapped at several addresses
// at once (cuda.h, cuMemMap), so the handle can also back a block's own
// range meanwhile. The staging mapping goes when the handle is released.
// Host handles are staged when created (every one is an eviction's
// destination); device handles when a copy first needs it (`stage`), so
// that a job that never restores pays nothing.
class PhysPool {
 public:
  PhysPool(const cu::Driver& d, const CUmemAllocationProp& prop, VaArena* stage_in = nullptr,
           int device = 0, bool stage_on_create = false)
      : d_(d),
        prop_(prop),
        stage_in_(stage_in),
        device_(device),
        stage_on_create_(stage_on_create && stage_in) {}
  ~PhysPool();
  PhysPool(const PhysPool&) = delete;
  PhysPool& operator=(const PhysPool&) = delete;

  // A handle of exactly `size` bytes, pooled or new (cuMemCreate's error
  // passes through, e.g. CUDA_ERROR_OUT_OF_MEMORY), and its staging address
  // (`*va`; 0 if not staged).
  CUresult take(size_t size, CUmemGenericAllocationHandle* out, uintptr_t* va = nullptr);
  // The staging address of a handle of this pool, mapped now if it has none.
  CUresult stage(CUmemGenericAllocationHandle h, size_t size, uintptr_t* va);
  // Back to the pool (its staging mapping kept).
  void give(CUmemGenericAllocationHandle h, size_t size) {
    free_[size].push_back(h);
    pooled_ += size;
  }
  // A handle created (and staged at `va`) by the caller, into the pool.
  void adopt(CUmemGenericAllocationHandle h, size_t size, uintptr_t va) {
    if (va) stage_of_[h] = va;
    give(h, size);
    held_ += size;
    ++creates_;
  }
  const CUmemAllocationProp& prop() const { return prop_; }
  // Releases pooled handles until at least `want` bytes are freed (or the
  // pool is empty), keeping one handle of `keep` bytes if there is one: the
  // size about to be taken. Returns the bytes released.
  size_t trim(size_t want, size_t keep = 0);
  bool has(size_t size) const { return count(size) > 0; }
  size_t count(size_t size) const {
    auto it = free_.find(size);
    return it == free_.end() ? 0 : it->second.size();
  }
  size_t held() const { return held_; }  // bytes in use + pooled
  size_t pooled() const { return pooled_; }
  uint64_t creates() const { return creates_; }

 private:
  // Gives up a handle: its staging mapping, then the handle. False (and the
  // handle kept, counted in held()) if the mapping cannot be undone or the
  // driver refuses the release (then retried at the next trim).
  bool release(CUmemGenericAllocationHandle h, size_t size);
  // cuMemRelease; a refused one goes to `unreleased_`, still counted.
  bool drop(CUmemGenericAllocationHandle h, size_t size);

  const cu::Driver& d_;
  CUmemAllocationProp prop_;
  VaArena* stage_in_;
  int device_;
  bool stage_on_create_;
  std::unordered_map<size_t, std::vector<CUmemGenericAllocationHandle>> free_;
  std::unordered_map<CUmemGenericAllocationHandle, uintptr_t> stage_of_;  // staged handles
  std::vector<std::pair<CUmemGenericAllocationHandle, size_t>> unreleased_;
  size_t held_ = 0, pooled_ = 0;
  uint64_t creates_ = 0;
};

// cuMemMap + cuMemSetAccess (read/write for `device`); undoes the map if
// access cannot be granted, and tries the pair once more if either failed.
CUresult map_rw(const cu::Driver& d, uintptr_t va, size_t size, CUmemGenericAllocationHandle h,
                int device);

}  // namespace spillway
