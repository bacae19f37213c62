// What backs a large block, and how it moves: one Backing per residency mode
// (design.md 4), so that nothing above it asks which mode is on.
//
//   host (default, host_backing.cpp): a block owns a granule-aligned range of
//     the VA arena backed by one physical allocation: device memory while
//     resident, pinned host memory mapped at the same address while evicted.
//   managed (managed_backing.cpp): a block is its own cuMemAllocManaged
//     allocation, moved by cuMemPrefetchAsync instead of remapped.
//
// Every call is made with the allocator's lock held. Eviction is two steps so
// that the copies can run without the lock: start_evict queues the copy (the
// block becomes kEvicting), finish_evict swaps it to its host copy once the
// copies are known done, or rolls back.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "block.h"
#include "block_table.h"
#include "copy_streams.h"
#include "driver.h"
#include "vmm.h"

namespace spillway {

// Device memory within the budget, from the allocator: the backings ask, the
// allocator's make-room cascade answers.
class DeviceRoom {
 public:
  virtual ~DeviceRoom() = default;
  // Frees device memory until `need` more bytes fit in the budget: pooled
  // handles and cached blocks, and live blocks if `evict_live` (a prefetch
  // never evicts one).
  virtual bool make_room(size_t need, bool evict_live) = 0;
  // A device handle of `size` bytes within the budget (making room, and more
  // room if the device itself is full, as make_room).
  virtual CUresult take_device(size_t size, CUmemGenericAllocationHandle* h, bool evict_live) = 0;
};

// What the backings share with the allocator (all outlive the backing).
struct BackingParts {
  const cu::Driver& d;
  int device;
  VaArena& arena;
  PhysPool& dev;  // device handles (small chunks take from it too)
  CopyStreams& streams;
  BlockTable& table;
  DeviceRoom& room;
};

class Backing {
 public:
  enum class Start {
    kStarted,  // the copy is queued: kEvicting
    kFailed,   // this block's copy could not be queued (it stays): try the next
    kStop,     // no more can be evicted now (host budget or host memory)
  };
  virtual ~Backing() = default;

  // False: this backing cannot evict here (no host-memory VMM, no concurrent
  // managed access, or SPILLWAY_MODE=off): the budget is off.
  virtual bool evicts() const = 0;
  // A new large block of `cap` bytes for `stream`, resident and placed in
  // the table; null if no memory (logged).
  virtual Block* create(size_t cap, CUstream stream) = 0;
  // `failed` is set when the attempt counts as a failed eviction.
  virtual Start start_evict(Block* b, uint64_t host_budget, bool* failed) = 0;
  // True: the block now lives on the host and its device memory is given
  // back; false: it stays on the device (cancelled, or a step failed).
  virtual bool finish_evict(Block* b, bool copied) = 0;
  // A use on `consumer` (null: a hold) cancels the eviction in flight; the
  // use waits for its copy, which may still read the device copy.
  virtual void cancel_evict(Block* b, const CUstream* consumer) = 0;
  // Makes an evicted block resident again; `consumer` (if not null) waits
  // for it in stream order, else the host waits.
  virtual CUresult restore(Block* b, const CUstream* consumer) = 0;
  // A restore in two steps, so that nobody waits for its copy: start_prefetch
  // queues the copy into new device memory while the block's address still
  // maps its host copy (kArriving: an access spillway does not see reads the
  // host copy, whole); finish_prefetch swaps the address to the device copy
  // once the copy is done (`wait`: the host waits for it; else false while
  // it runs); abort_prefetch drops the device copy (the block stays kHost).
  // Backings that cannot: kFailed.
  virtual Start start_prefetch(Block* /*b*/) { return Start::kFailed; }
  virtual bool finish_prefetch(Block* /*b*/, bool /*wait*/) { return false; }
  virtual void abort_prefetch(Block* /*b*/) {}
  // Maps a block left `unmapped` again (its device memory or host copy,
  // where it is); true once its address is mapped.
  virtual bool remap(Block* b) { return !b->unmapped; }
  // Gives back the memory of a free block, resident (a cached one) or
  // evicted (its users drained by the caller), and forgets its range.
  virtual bool release(Block* b) = 0;
  // The destructor's: every block's memory, whatever its state.
  virtual void release_all() = 0;

  // Device memory held beyond the handles of the device pool (not virtual:
  // every malloc reads it).
  uint64_t device_beyond_pool() const { return beyond_pool_; }
  // Host memory held for evicted (or evicting) blocks.
  virtual uint64_t host_held() const = 0;
  // Device bytes that taking a block of `need` bytes would add.
  virtual uint64_t added_by(size_t need) const = 0;
  virtual uint64_t host_creates() const { return 0; }
  // Creates host memory for evictions to come until `target` bytes of it are
  // free in the pool, within `host_budget` (0: none); `lock` (the
  // allocator's) is held on entry and on return, and released while memory
  // is created. Returns the bytes created.
  virtual size_t grow_host_reserve(size_t /*target*/, uint64_t /*host_budget*/,
                                   std::unique_lock<std::mutex>& /*lock*/) {
    return 0;
  }
  virtual uint64_t host_reserved() const = 0;  // host memory behind evicted blocks

 protected:
  uint64_t beyond_pool_ = 0;
};

// The backing SPILLWAY_MODE asks for (`managed`, or host remap when
// `evict`), if the device can do it; else, with one warning, host backing
// that never evicts (evicts() false): spillway then only caches (contract 4).
std::unique_ptr<Backing> make_backing(const BackingParts& parts, bool managed, bool evict);
std::unique_ptr<Backing> make_host_backing(const BackingParts& parts, bool evicts);
std::unique_ptr<Backing> make_managed_backing(const BackingParts& parts);

}  // namespace spillway
