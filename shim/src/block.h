// One allocation spillway serves, and the states a large block moves through.
// Every part of the allocator reads this one struct; the allocator's lock
// guards every field.
//
//   kDevice --start_evict--> kEvicting --finish_evict--> kHost
//      ^                        |  (cancelled: used or freed meanwhile)   |
//      +------------------------+<----------------restore-----------------+
//      ^                                                                  |
//      +--finish_prefetch-- kArriving <--------start_prefetch-------------+
//                              (abort_prefetch: back to kHost)
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "events.h"
#include "raii.h"
#include "vmm.h"

namespace spillway {

struct UseMark;  // copy_streams.h

struct Block {
  enum class Where : uint8_t {
    kDevice,    // device memory behind ptr
    kEvicting,  // device memory still behind ptr; a copy to the host in flight
    kHost,      // host memory behind ptr (mapped there, or managed pages on the host)
    // host memory still behind ptr; a copy into device memory (`dev`, at
    // its staging address, vmm.h) in flight: the swap to it waits for the
    // copy
    kArriving,
  };
  uintptr_t ptr = 0;
  // Requested bytes while live; of a split block, from ptr to the end of its
  // last allocation (its allocations' ranges within are what a move copies).
  size_t size = 0;
  size_t cap = 0;               // bytes behind it: a granule multiple for large blocks
  CUstream stream = nullptr;    // the allocation stream: its free list on reuse
  std::vector<CUstream> users;  // other streams seen using it (contract 3)
  // Large blocks: per stream, the mark after its latest use there
  // (copy_streams.h); a copy waits for the tail of a stream without one.
  std::vector<std::pair<CUstream, UseMark*>> marks;
  // kEvicting: the mark right after its copy on the D2H stream, so that
  // whoever finishes the eviction waits for that copy, not for the ones
  // queued after it (copy_streams.h).
  UseMark* departure = nullptr;
  // Freed, and no mark recorded on its stream since (CopyStreams::freed).
  bool unfenced = false;
  bool large = false;
  bool live = false;
  Where where = Where::kDevice;
  bool cancel = false;  // kEvicting: used or freed meanwhile, keep the device copy
  // Host backing: nothing is mapped at its range (a swap of mappings and its
  // rollback both failed); its bytes are in `dev` (kDevice) or its host
  // pieces (kHost). Nothing spillway queues reads it, and its next use maps
  // it again first (Backing::remap).
  bool unmapped = false;
  // Host backing: the device handle behind it (kArriving: the device copy,
  // written at its staging address); its host memory, pieces mapped over
  // the ranges of live allocations while evicted (host_backing.cpp), each
  // with its staging address (vmm.h: mapped for as long as the handle is
  // held, the eviction copy's destination).
  struct HostPiece {
    CUmemGenericAllocationHandle h = 0;
    uintptr_t va = 0;  // its staging address
    size_t off = 0;    // where it is mapped in the block's range while evicted
    size_t size = 0;
  };
  CUmemGenericAllocationHandle dev = 0;
  std::vector<HostPiece> host;
  uint64_t last_use = 0;
  uint32_t holds = 0;            // graphs, collectives, pins: not evicted while > 0
  Cause cause = Cause::kBudget;  // kEvicting: why
  uint64_t queued_ns = 0;        // kEvicting: when the copy was queued
  std::vector<Event> pending;    // freed: events on `users` that must complete first
  // A split block: a larger cached block taken under a budget serves several
  // allocations of its stream (allocator.cpp, malloc_large), so that a
  // shorter step reuses a longer one's memory without driver calls. It still
  // moves as one. `parts`: each live allocation's address and requested
  // size; `spare`: the ranges none holds. Both empty for a block of one.
  std::map<uintptr_t, size_t> parts;
  FreeRanges spare;
};

}  // namespace spillway
