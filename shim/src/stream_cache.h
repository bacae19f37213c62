// The stream-ordered cache: free blocks waiting to be reused, as in
// PyTorch's caching allocator (design.md contract 3). A freed block goes back
// to its allocation stream's free list at once and is reused by that stream;
// another stream takes it only behind an event recorded on the freeing
// stream's work; a block other streams used waits for their events first.
//
// Small blocks (below SPILLWAY_MIN_BLOCK) are carved from chunks that belong
// to one stream, as in PyTorch's small pool; freed ones are kept by (stream,
// size) so that a repeated step reuses them in O(1), and given back to their
// chunks (to coalesce) before a new chunk is made or chunks are released.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "block.h"
#include "block_table.h"
#include "copy_streams.h"
#include "log.h"
#include "vmm.h"

namespace spillway {

class StreamCache {
 public:
  StreamCache(const cu::Driver& d, BlockTable& table) : d_(d), table_(table) {}

  // A cached large block of at least `cap` bytes wasting at most `slack`,
  // for `stream`: its own first, else another stream's once `stream` is
  // ordered after that stream's queued work. Null if none.
  Block* take_large(size_t cap, size_t slack, CUstream stream, CopyStreams& streams);
  // A freed block: reusable now, or once the events recorded on the streams
  // that used it (and `evicting_on`, the copy stream, if its eviction copy is
  // in flight) have completed. False if it is kept out of use instead (an
  // event could not be recorded: give_later).
  bool give(Block* b, CUstream evicting_on) {
    if (evicting_on || !b->users.empty()) return give_later(b, evicting_on);
    make_reusable(b);
    return true;
  }
  // Split blocks (block.h) with spare ranges, by their stream: a request
  // of `n` bytes (a kSmallAlign multiple) takes the best fit among those of
  // `stream` whose memory is on the device; 0 if none.
  void add_split(Block* b) { split_[b->stream].push_back(b); }
  void drop_split(Block* b);
  uintptr_t take_spare(size_t n, CUstream stream, Block** owner);
  // Frees whose events completed become reusable.
  void process_pending() {
    if (!pending_.empty()) reuse_pending();
  }

  // Small blocks: a freed one of exactly `n` bytes, or a range carved from
  // the stream's chunks (0 if none has room).
  Block* reuse_small(size_t n, CUstream stream) {
    auto it = small_.find({stream, n});
    if (it == small_.end() || it->second.empty()) return nullptr;
    Block* b = it->second.back();
    it->second.pop_back();
    return b;
  }
  uintptr_t carve_small(size_t n, CUstream stream);
  // A new chunk for `stream`; returns the range of `n` bytes carved from it.
  uintptr_t add_chunk(uintptr_t va, size_t size, CUmemGenericAllocationHandle h, CUstream stream,
                      size_t n);
  uint64_t small_bytes() const { return small_bytes_; }

  // Gives back memory held by free blocks until `want` bytes are freed: each
  // stream with any is drained once (its queued work may still use them),
  // then `release_chunk` / `release_large` unmap them (false: keep it).
  // Returns the bytes released.
  using ReleaseChunk = std::function<bool(uintptr_t va, size_t size, CUmemGenericAllocationHandle)>;
  using ReleaseLarge = std::function<bool(Block*)>;
  size_t release(size_t want, CopyStreams& streams, const ReleaseChunk& release_chunk,
                 const ReleaseLarge& release_large);

  // Every chunk (the allocator's destructor unmaps them).
  template <class F>
  void for_each_chunk(F&& f) const {
    for (auto& [va, c] : chunks_) f(c->va, c->size, c->handle);
  }

 private:
  struct Chunk {
    uintptr_t va = 0;
    size_t size = 0;
    CUmemGenericAllocationHandle handle = 0;
    CUstream stream = nullptr;
    FreeRanges free;
  };
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
  // The block returns to its allocation stream, whatever stream freed it:
  // that is the stream its last uses are ordered on.
  void make_reusable(Block* b) {
    if (b->large)
      large_[b->stream][b->cap].push_back(b);
    else
      small_[{b->stream, b->cap}].push_back(b);
  }
  bool give_later(Block* b, CUstream evicting_on);
  void reuse_pending();
  Event take_event();
  void flush_small();
  Chunk* chunk_of(uintptr_t p);
  size_t release_chunks(size_t want, CopyStreams& streams, const ReleaseChunk& release_chunk);

  const cu::Driver& d_;
  BlockTable& table_;
  // Free large blocks by stream, then capacity (best fit). Keys stay when
  // their vector empties: a repeated step reuses the vector, so taking and
  // returning a block allocates nothing.
  using SizeLists = std::map<size_t, std::vector<Block*>>;
  std::map<CUstream, SizeLists> large_;
  std::map<CUstream, std::vector<Block*>> split_;
  std::vector<Block*> pending_;                         // freed, waiting for user-stream events
  std::vector<Event> events_;                           // pool for pending frees
  std::map<uintptr_t, std::unique_ptr<Chunk>> chunks_;  // by base address
  std::map<CUstream, std::vector<Chunk*>> stream_chunks_;
  std::unordered_map<SmallKey, std::vector<Block*>, SmallKeyHash> small_;
  uint64_t small_bytes_ = 0;
  // Bytes of freed blocks kept out of use (give_later): never reused; the
  // allocator's end releases them with every other block.
  uint64_t kept_bytes_ = 0;
  log::Repeats kept_;
};

}  // namespace spillway
