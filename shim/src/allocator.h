// The allocator of one device: every allocation PyTorch makes passes through
// malloc/free here.
//
// Small blocks (below SPILLWAY_MIN_BLOCK) are carved from pooled chunks and
// never evicted. Large blocks each own a granule-aligned range of one VA
// arena, backed by one physical allocation: device memory while resident,
// host memory at the same address while evicted (design.md 4.1).
//
// SPILLWAY_MODE=managed (design.md 4.2) changes only what backs a large
// block: its own cuMemAllocManaged allocation, moved by cuMemPrefetchAsync
// instead of remapped. Everything above the backing (stream-ordered reuse,
// the budget, victims, the tracker's hooks, statistics, observer events) is
// shared, and small-block chunks stay VMM device memory in the arena. One
// allocation per block rather than blocks carved from one big managed arena:
// a kernel touching an arena would, on the simulator, migrate all of it (it
// sees pointers, not extents), and a released block can simply be freed
// (cuMemFree: no byte moved) where an arena range would need a prefetch of
// its garbage to the host. The price is a driver call per new block (cached
// blocks are reused, so a repeated step makes none) and an ordered map to
// find a block from an address outside the arena.
//
// Reuse is stream-ordered, as in PyTorch's caching allocator: a freed block
// goes back to its stream's free list at once and is reused by that stream;
// another stream takes it only behind an event recorded on the freeing stream
// (design.md contract 3).
//
// The budget counts the device physical memory spillway holds (live and
// cached large blocks, pooled handles); an allocation that would cross it
// first releases cached memory, then evicts live blocks chosen by the policy.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <string>
#include <unordered_map>
#include <vector>

#include "access.h"
#include "raii.h"
#include "events.h"
#include "driver.h"
#include "stats.h"
#include "victims.h"
#include "vmm.h"

namespace spillway {

struct AllocatorOptions {
  int device = 0;
  uint64_t gpu_budget = 0;   // bytes
  uint64_t host_budget = 0;  // bytes
  uint64_t min_block = 1ull << 20;
  bool evict = true;  // false in SPILLWAY_MODE=off: caching only
  // SPILLWAY_MODE=managed. Needs CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS
  // and a managed arena; without either, one warning and caching only, as in
  // host mode without host-memory VMM.
  bool managed = false;
  // Evict ahead of need from a background thread when resident memory nears
  // the budget. Safe only when every access is seen (the access tracker can
  // cancel an eviction in flight); see docs/limitations.md.
  bool background = false;
  // Test seam: called by the background thread after an eviction batch's
  // copies completed and before it swaps the mappings (without the lock).
  std::function<void()> before_swap;
  // Told of every transfer and change of memory held (may be null).
  Observer* observer = nullptr;
  // The eviction policy (null: the learned schedule, policy/schedule.h);
  // told of every allocation, free, access and step of large blocks.
  std::shared_ptr<policy::VictimChooser> chooser;
};

class Allocator final : public AccessSink {
 public:
  // Returns nullptr (and why) if the VA arena or copy streams cannot be set up.
  static std::unique_ptr<Allocator> create(const cu::Driver& d, const AllocatorOptions& o,
                                           std::string* why);
  ~Allocator() override;

  void* malloc(size_t size, CUstream stream);
  // Refuses (logs, changes nothing) a pointer that is not a live allocation
  // or a size that differs from the allocation's.
  void free(void* ptr, size_t size, CUstream stream);

  // Residency, for tests and the access tracker: make the block that
  // contains `ptr` resident before `stream` uses it (cancelling an eviction
  // in flight); evict it to host memory now.
  CUresult restore(const void* ptr, CUstream stream);
  CUresult evict(const void* ptr);
  // `stream` uses the block containing `ptr`: its free will wait for that
  // stream's work (what record_stream does, which a pluggable allocator never
  // receives).
  void note_use(const void* ptr, CUstream stream);

  // AccessSink: the tracker reports every launch, copy and set here.
  bool may_own(uintptr_t p) const override {
    return arena_.contains(p) || (p >= managed_lo_.load(std::memory_order_relaxed) &&
                                  p < managed_hi_.load(std::memory_order_relaxed));
  }
  void envelope(uintptr_t* lo, uintptr_t* hi) const override {
    *lo = std::min<uintptr_t>(arena_.base(), managed_lo_.load(std::memory_order_relaxed));
    *hi = std::max<uintptr_t>(arena_.base() + arena_.size(),
                              managed_hi_.load(std::memory_order_relaxed));
  }
  void before_use(const Access& a, const Touch* touches, size_t n) override;
  void hold(const Touch* touches, size_t n) override;
  void release(const Touch* touches, size_t n) override;

  enum class Residency { kUnknown, kDevice, kEvicting, kHost };
  Residency residency(const void* ptr);

  // A training step ended (spillway_mark_step) after access number `end`
  // (Access::seq): the policy's schedule turns.
  void mark_step(uint64_t end);

  Stats stats();
  // Stops the background eviction thread (at exit: it must not outlive the
  // logger and the driver). Idempotent.
  void stop_background();
  // Logs the resident set (largest blocks, totals): what a user needs after an OOM.
  void log_resident_set(const char* why);

 private:
  struct Block;

  Allocator(const cu::Driver& d, const AllocatorOptions& o);

  void* malloc_small(size_t size, CUstream stream);
  void* malloc_large(size_t size, CUstream stream);
  Block* take_cached(size_t cap, CUstream stream);
  void make_reusable(Block* b);
  void process_pending();  // frees whose user-stream events completed
  Event take_event();
  void note_user(Block* b, CUstream stream);
  // The live or cached block containing `p` (large: any interior address).
  Block* owner_of(uintptr_t p);
  void set_owner(Block* b);
  void forget_owner(Block* b);
  Block* new_large(size_t cap, CUstream stream);
  Block* new_block();
  void free_evicted(Block* b);
  void note_live(Block* b, size_t size, CUstream stream);

  // Device memory of `size` bytes within the budget, making room (and, if the
  // device itself is full, more room) as needed.
  CUresult take_device(size_t size, CUmemGenericAllocationHandle* h);
  // Frees device memory until `need` more bytes fit in the budget.
  bool make_room(size_t need);
  // Bytes over the budget if `need` more were taken now.
  size_t excess(size_t need) const;
  // Unmap free cached blocks / evict live ones; their device memory goes to
  // the pool. Return the bytes given back.
  size_t release_cached(size_t want);
  size_t evict_for(size_t want, Cause cause);
  std::vector<Block*> choose_victims(size_t want);
  // Evicts these blocks now; returns the device bytes given back to the pool.
  size_t evict_blocks(const std::vector<Block*>& victims, Cause cause);
  // Eviction in two steps so the copies can run without the lock: start
  // queues them (blocks become kEvicting), finish swaps the mappings once the
  // copies are done, or keeps the device memory if an eviction was cancelled.
  std::vector<Block*> start_evictions(const std::vector<Block*>& victims, Cause cause);
  // Queue one block's eviction (it becomes kEvicting, or stays kDevice if its
  // copy failed); false: stop, no more can be evicted now.
  bool start_host_eviction(Block* b);
  bool start_managed_eviction(Block* b);
  // A use or a hold while the block's eviction is in flight keeps it.
  void cancel_eviction(Block* b, const CUstream* consumer);
  size_t finish_evictions(const std::vector<Block*>& started, bool copied);
  // `consumer` (if not null) waits for the restore in stream order; else
  // the host waits for it.
  CUresult restore_block(Block* b, Cause cause, const CUstream* consumer);
  CUresult restore_managed(Block* b, Cause cause, const CUstream* consumer, uint64_t queued);
  // The block is resident again: state, statistics, the observer.
  void note_restored(Block* b, Cause cause, uint64_t queued);
  // Managed mode: room in the budget for `size` more resident bytes.
  bool take_managed(size_t size);
  Block* new_managed(size_t cap, CUstream stream);
  CUresult free_managed(Block* b);  // cuMemFree, after the caller drained its users
  Block* managed_at(uintptr_t p) const;
  // Managed mode: queue a migration of [p, p+n) to the device or the host.
  CUresult prefetch(uintptr_t p, size_t n, bool to_device, CUstream s);
  // Device memory no longer behind a large block: to the handle pool (host
  // mode) or out of the resident count (managed mode; the caller has queued
  // the prefetch that moves the pages).
  void give_device(CUmemGenericAllocationHandle h, size_t size);
  // Calls `large` for each live large block under the ranges, `small` for a
  // live small block starting at a range's first byte.
  template <class Large, class Small>
  void for_each_block(const Touch* touches, size_t n, Large&& large, Small&& small);
  void notify_memory();  // tells the observer what is held now
  void background_loop();
  // Makes `waiter` wait for all work queued so far on `s` (on every stream
  // that uses `b`).
  CUresult order_after(CUstream waiter, CUstream s);
  CUresult order_after_users(CUstream waiter, const Block* b);
  // Blocks the host until work queued so far on `s` is done.
  CUresult drain(CUstream s);
  CUresult not_capturing(CUstream s);

  // Device physical memory held: live, cached and pooled blocks, small chunks.
  // In managed mode, plus the managed blocks spillway has placed on the
  // device (prefetched there) and not since moved to the host.
  uint64_t resident() const { return dev_.held() + managed_dev_; }
  // Host memory held for evicted (or evicting) blocks.
  uint64_t host_held() const { return o_.managed ? managed_host_ : host_.held(); }
  Block* find_live(uintptr_t p);
  bool ensure_context();

  const cu::Driver& d_;
  AllocatorOptions o_;
  size_t granule_ = 0;
  std::mutex mu_;
  VaArena arena_;
  PhysPool dev_, host_;
  Stream d2h_, h2d_;
  Event ev_;                     // order_after / drain, under the lock
  Event bg_ev_;                  // the background thread's wait, outside the lock
  std::vector<Event> events_;    // pool for pending frees
  std::vector<Block*> pending_;  // freed, waiting for user-stream events
  std::vector<Block*> claimed_;  // before_use: the launch's blocks so far
  std::vector<Block*> owners_;   // large block owning each granule of the arena
  uint64_t high_water_ = 0;      // background eviction starts above this
  uint64_t managed_dev_ = 0;     // managed mode: see resident()
  uint64_t managed_host_ = 0;    // managed mode: see host_held()
  // Managed mode: every large block (live or cached) by address, and the
  // span they have covered (read by the tracker without the lock).
  std::map<uintptr_t, Block*> managed_blocks_;
  std::atomic<uintptr_t> managed_lo_{UINTPTR_MAX}, managed_hi_{0};
  // An allocation once had to evict live blocks: the job does not fit the
  // budget, so evicting ahead of need pays. Until then the background thread
  // moves nothing (a job that fits moves no byte).
  bool over_budget_seen_ = false;
  std::thread bg_;
  std::condition_variable bg_cv_;
  bool bg_stop_ = false;
  CUcontext ctx_ = nullptr;
  std::shared_ptr<policy::VictimChooser> chooser_;

  std::unordered_map<uintptr_t, Block*> live_;  // by pointer
  // Free large blocks by stream, then capacity (best fit).
  // (Keys stay when their vector empties: a repeated step reuses the vector,
  // so taking and returning a block allocates nothing.)
  using SizeLists = std::map<size_t, std::vector<Block*>>;
  std::map<CUstream, SizeLists> cached_large_;
  std::vector<std::unique_ptr<Block>> blocks_;  // owns every block
  std::vector<Block*> spare_;                   // Block objects not in use

  // Small blocks are carved from chunks that belong to one stream, so their
  // reuse is ordered by that stream, as in PyTorch's small pool.
  struct Chunk {
    uintptr_t va = 0;
    size_t size = 0;
    CUmemGenericAllocationHandle handle = 0;
    CUstream stream = nullptr;
    FreeRanges free;
  };
  std::map<uintptr_t, std::unique_ptr<Chunk>> chunks_;  // by base address
  std::map<CUstream, std::vector<Chunk*>> stream_chunks_;
  // Freed small blocks by (stream, size): a repeated step reuses them in
  // O(1). Given back to their chunks (to coalesce) before a new chunk is
  // made or chunks are released.
  struct SmallKey {
    CUstream stream;
    size_t size;
    bool operator==(const SmallKey&) const = default;
  };
  struct SmallKeyHash {
    size_t operator()(const SmallKey& k) const {
      return std::hash<const void*>()(k.stream) ^ (k.size * 0x9E3779B97F4A7C15ull);
    }
  };
  std::unordered_map<SmallKey, std::vector<Block*>, SmallKeyHash> small_cache_;
  void flush_small_cache();
  Chunk* new_chunk(size_t at_least, CUstream stream);
  Chunk* chunk_of(uintptr_t p);
  size_t release_free_chunks(size_t want);
  uint64_t small_bytes_ = 0;
  uint64_t tick_ = 0;
  Stats s_;
};

}  // namespace spillway
