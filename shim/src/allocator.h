// The allocator of one device: every allocation PyTorch makes passes through
// malloc/free here.
//
// Small blocks (below SPILLWAY_MIN_BLOCK) are carved from pooled chunks and
// never evicted. Large blocks each own a granule-aligned range of one VA
// arena, backed by one physical allocation: device memory while resident,
// host memory at the same address while evicted (design.md 4.1).
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

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cu_raii.h"
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
};

class Allocator {
 public:
  // Returns nullptr (and why) if the VA arena or copy streams cannot be set up.
  static std::unique_ptr<Allocator> create(const cu::Driver& d, const AllocatorOptions& o,
                                           std::string* why);
  ~Allocator();

  void* malloc(size_t size, CUstream stream);
  // Refuses (logs, changes nothing) a pointer that is not a live allocation
  // or a size that differs from the allocation's.
  void free(void* ptr, size_t size, CUstream stream);

  // Residency, for tests and (later) the access tracker: make the block that
  // contains `ptr` resident before `stream` uses it; evict it to host memory.
  CUresult restore(const void* ptr, CUstream stream);
  CUresult evict(const void* ptr);

  Stats stats();
  // Logs the resident set (largest blocks, totals): what a user needs after an OOM.
  void log_resident_set(const char* why);

 private:
  struct Block;

  Allocator(const cu::Driver& d, const AllocatorOptions& o);

  void* malloc_small(size_t size, CUstream stream);
  void* malloc_large(size_t size, CUstream stream);
  Block* take_cached(size_t cap, CUstream stream);
  Block* new_large(size_t cap, CUstream stream);
  Block* new_block();
  void free_evicted(Block* b);
  void note_live(Block* b, size_t size, CUstream stream);

  // Frees device memory until `need` more bytes fit in the budget.
  bool make_room(size_t need);
  // Bytes over the budget if `need` more were taken now.
  size_t excess(size_t need) const;
  // Unmap free cached blocks / evict live ones; their device memory goes to
  // the pool. Return the bytes given back.
  size_t release_cached(size_t want);
  size_t evict_for(size_t want);
  // Evicts these blocks; returns the device bytes given back to the pool.
  size_t evict_blocks(const std::vector<Block*>& victims);
  CUresult restore_block(Block* b, CUstream stream);
  // Makes `waiter` wait for all work queued so far on `s`.
  CUresult order_after(CUstream waiter, CUstream s);
  // Blocks the host until work queued so far on `s` is done.
  CUresult drain(CUstream s);

  // Device physical memory held: live, cached and pooled blocks, small chunks.
  uint64_t resident() const { return dev_.held(); }
  Block* find_live(uintptr_t p);
  bool ensure_context();

  const cu::Driver& d_;
  AllocatorOptions o_;
  size_t granule_ = 0;
  std::mutex mu_;
  VaArena arena_;
  PhysPool dev_, host_;
  Stream d2h_, h2d_;
  Event ev_;
  CUcontext ctx_ = nullptr;
  std::unique_ptr<policy::VictimChooser> chooser_;

  std::unordered_map<uintptr_t, Block*> live_;  // by pointer
  // Free large blocks by stream, then capacity (best fit).
  std::map<CUstream, std::multimap<size_t, Block*>> cached_large_;
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
  Chunk* new_chunk(size_t at_least, CUstream stream);
  Chunk* chunk_of(uintptr_t p);
  size_t release_free_chunks(size_t want);
  uint64_t small_bytes_ = 0;
  uint64_t tick_ = 0;
  Stats s_;
};

}  // namespace spillway
