#include "stream_cache.h"

#include <algorithm>

#include "size.h"

namespace spillway {

Block* StreamCache::take_large(size_t cap, size_t slack, CUstream stream, CopyStreams& streams) {
  const size_t limit = cap + slack;
  auto take_from = [&](SizeLists& m) -> Block* {
    for (auto it = m.lower_bound(cap); it != m.end() && it->first <= limit; ++it) {
      if (it->second.empty()) continue;
      Block* b = it->second.back();
      it->second.pop_back();
      return b;
    }
    return nullptr;
  };
  if (auto it = large_.find(stream); it != large_.end())
    if (Block* b = take_from(it->second)) {
      streams.reused(*b);
      return b;
    }
  // Another stream's free block: usable once this stream is ordered after all
  // the work the freeing stream had queued before the free (contract 3).
  for (auto& [other, m] : large_) {
    if (other == stream) continue;
    if (Block* b = take_from(m)) {
      if (streams.order_after_uses(stream, *b) == CUDA_SUCCESS) {
        streams.reused(*b);
        return b;
      }
      m[b->cap].push_back(b);  // could not order: leave it where it was
    }
  }
  return nullptr;
}

void StreamCache::drop_split(Block* b) {
  auto it = split_.find(b->stream);
  if (it == split_.end()) return;
  std::erase(it->second, b);
}

uintptr_t StreamCache::take_spare(size_t n, CUstream stream, Block** owner) {
  auto it = split_.find(stream);
  if (it == split_.end()) return 0;
  // Best fit across the blocks: the smallest spare range that holds n.
  Block* best = nullptr;
  size_t best_len = SIZE_MAX;
  for (Block* b : it->second) {
    if (b->where != Block::Where::kDevice) continue;  // its spare is not device memory now
    const size_t len = b->spare.fit(n);
    if (len && len < best_len) {
      best = b;
      best_len = len;
    }
  }
  if (!best) return 0;
  *owner = best;
  return best->spare.take(n);
}

bool StreamCache::give_later(Block* b, CUstream evicting_on) {
  // Reusable once an event recorded now on each stream that may still touch
  // it has completed: its eviction copy's (the copy reads it, and a new
  // owner's writes must not race it), and each other stream that used it
  // (PyTorch's record_stream, done for the user).
  bool ordered = true;
  auto after = [&](CUstream s) {
    Event e = take_event();
    if (e && CU_CALL(d_, cuEventRecord, e.get(), s) == CUDA_SUCCESS) {
      b->pending.push_back(std::move(e));
      return;
    }
    ordered = false;
    if (e) events_.push_back(std::move(e));
  };
  if (evicting_on) after(evicting_on);
  for (CUstream u : b->users) after(u);
  b->users.clear();
  if (!ordered) {
    // That work can be neither waited for nor ordered after: the block is
    // kept out of use rather than handed to a new owner under it.
    for (Event& e : b->pending) events_.push_back(std::move(e));
    b->pending.clear();
    kept_bytes_ += b->cap;
    log::error_repeated(kept_,
                        "a freed block of {} cannot be ordered after the work queued on it (an "
                        "event record failed); it is kept out of use ({} kept so far)",
                        format_bytes(b->cap), format_bytes(kept_bytes_));
    return false;
  }
  if (!b->pending.empty())
    pending_.push_back(b);
  else
    make_reusable(b);
  return true;
}

void StreamCache::reuse_pending() {
  for (size_t i = 0; i < pending_.size();) {
    Block* b = pending_[i];
    bool done = true;
    for (const Event& e : b->pending) done = done && d_.cuEventQuery(e.get()) == CUDA_SUCCESS;
    if (!done) {
      ++i;
      continue;
    }
    for (Event& e : b->pending) events_.push_back(std::move(e));
    b->pending.clear();
    make_reusable(b);
    pending_[i] = pending_.back();
    pending_.pop_back();
  }
}

Event StreamCache::take_event() {
  if (events_.empty()) return Event(d_);
  Event e = std::move(events_.back());
  events_.pop_back();
  return e;
}

uintptr_t StreamCache::carve_small(size_t n, CUstream stream) {
  auto carve = [&]() -> uintptr_t {
    for (Chunk* c : stream_chunks_[stream])
      if (uintptr_t p = c->free.take(n)) return p;
    return 0;
  };
  uintptr_t p = carve();
  if (!p && !small_.empty()) {
    flush_small();  // coalesce what other sizes left behind first
    p = carve();
  }
  return p;
}

uintptr_t StreamCache::add_chunk(uintptr_t va, size_t size, CUmemGenericAllocationHandle h,
                                 CUstream stream, size_t n) {
  auto c = std::make_unique<Chunk>();
  c->va = va;
  c->size = size;
  c->handle = h;
  c->stream = stream;
  c->free.give(va, size);
  Chunk* raw = c.get();
  chunks_[va] = std::move(c);
  stream_chunks_[stream].push_back(raw);
  small_bytes_ += size;
  return raw->free.take(n);
}

void StreamCache::flush_small() {
  for (auto& [key, v] : small_) {
    for (Block* b : v) {
      chunk_of(b->ptr)->free.give(b->ptr, b->cap);
      table_.recycle(b);
    }
  }
  small_.clear();
}

StreamCache::Chunk* StreamCache::chunk_of(uintptr_t p) {
  auto it = chunks_.upper_bound(p);
  if (it == chunks_.begin()) return nullptr;
  --it;
  return p < it->first + it->second->size ? it->second.get() : nullptr;
}

size_t StreamCache::release_chunks(size_t want, CopyStreams& streams,
                                   const ReleaseChunk& release_chunk) {
  flush_small();  // cached small blocks keep their chunks busy
  size_t freed = 0;
  for (auto& [stream, v] : stream_chunks_) {
    bool drained = false;
    for (auto it = v.begin(); it != v.end() && freed < want;) {
      Chunk* c = *it;
      if (c->free.free_bytes() != c->size) {
        ++it;
        continue;
      }
      if (!drained && streams.drain(stream) != CUDA_SUCCESS) break;
      drained = true;
      if (!release_chunk(c->va, c->size, c->handle)) {
        ++it;
        continue;
      }
      freed += c->size;
      small_bytes_ -= c->size;
      it = v.erase(it);
      chunks_.erase(c->va);
    }
  }
  return freed;
}

size_t StreamCache::release(size_t want, CopyStreams& streams, const ReleaseChunk& release_chunk,
                            const ReleaseLarge& release_large) {
  size_t freed = release_chunks(want, streams, release_chunk);
  // First the blocks whose work before their free is done, then the others,
  // waiting for that work: a block freed long ago costs no wait.
  for (const bool wait : {false, true}) {
    for (auto& [stream, m] : large_) {
      for (auto& [cap, v] : m) {
        for (size_t i = 0; i < v.size() && freed < want;) {
          Block* b = v[i];
          // A block whose eviction was cancelled is referenced by that batch
          // until it finishes.
          const bool ready =
              b->where == Block::Where::kDevice &&
              (wait ? streams.wait_freed(*b) : streams.query_freed(*b)) == CUDA_SUCCESS;
          if (!ready) {
            ++i;
            continue;
          }
          const size_t bytes = b->cap;
          streams.reused(*b);  // its fence goes back to the pool with it
          if (!release_large(b)) {
            ++i;
            continue;
          }
          freed += bytes;
          v[i] = v.back();
          v.pop_back();
        }
      }
    }
  }
  return freed;
}

}  // namespace spillway
