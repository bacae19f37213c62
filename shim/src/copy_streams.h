// spillway's own copy streams, and the one way its work is ordered after the
// job's: an event on the job's stream, waited for by a copy stream
// (order_after_uses) or by the host (wait_uses, drain). Used under the
// allocator's lock.
//
// A copy of a block waits for the block's own last use on each stream, not
// for everything queued there: once the job is under pressure, the work that
// used large blocks is followed by a mark (an event recorded right after it,
// shared by all the blocks it used), and a block keeps the latest mark of
// each stream that used it. A stream without a mark (blind mode, before the
// first eviction, after a use spillway did not see end: a collective, a
// graph) is waited for to its tail, as before marks existed.
#pragma once

#include <cuda.h>

#include <memory>
#include <vector>

#include "block.h"
#include "driver.h"
#include "raii.h"

namespace spillway {

// An event recorded after work that used large blocks, shared by them and
// pooled: it goes back to the pool when no block refers to it (a wait
// already queued on it is bound to its record, cuda.h cuStreamWaitEvent).
struct UseMark {
  Event ev;
  uint32_t refs = 0;
};

class CopyStreams {
 public:
  explicit CopyStreams(const cu::Driver& d)
      : d_(d), d2h_(d, CU_STREAM_NON_BLOCKING), h2d_(d, CU_STREAM_NON_BLOCKING), ev_(d) {}
  explicit operator bool() const { return d2h_ && h2d_ && ev_; }

  CUstream d2h() const { return d2h_.get(); }
  CUstream h2d() const { return h2d_.get(); }

  // An event recorded on a capturing stream would become part of the graph
  // (and a wait on it would join the waiter into the capture): spillway does
  // not order its own work after a stream while it captures.
  CUresult not_capturing(CUstream s) const;
  // `waiter` waits for all work queued so far on `s`.
  CUresult order_after(CUstream waiter, CUstream s);
  // `waiter` waits for every use of `b`: its mark on each stream that used
  // it, or that stream's tail where it has none.
  CUresult order_after_uses(CUstream waiter, const Block& b);
  // The host waits for the same.
  CUresult wait_uses(const Block& b);
  // The host waits for all work queued so far on `s`.
  CUresult drain(CUstream s);
  // The host waits for a copy of spillway's: the one `m` follows on a copy
  // stream (a prefetch's arrival, say).
  CUresult wait(const UseMark& m) { return wait_event(m.ev.get(), true); }
  // Wall-clock time the host spent waiting for spillway's copies (wait,
  // wait_departure, a drain of a copy stream), not for the job's work
  // (wait_uses, a drain of the job's stream): the job's threads, as the mover
  // waits for its copies on its own. The exit summary's "waited for
  // transfers".
  uint64_t waited_ns() const { return waited_ns_; }

  // A mark after the work just queued on `s` (not capturing); null if it
  // cannot be recorded (the blocks then keep no mark for `s`).
  UseMark* record_mark(CUstream s);
  // `b`'s latest use on `s` is the work `m` follows.
  void set_mark(Block& b, CUstream s, UseMark* m);
  // `b` is (or may be) used on `s` after its mark there: forget that mark.
  void clear_mark(Block& b, CUstream s);
  void clear_marks(Block& b);
  // Each stream that used one of `blocks` (its own, its users) and has no
  // mark for it gets one now, at that stream's tail (one record per stream):
  // later copies of the block (a prefetch after this eviction) then wait for
  // the uses seen so far, not for the tail they find. Valid only while every
  // use of the blocks is seen (before_use clears a stream's mark); streams
  // capturing a graph are left without.
  void mark_tails(const std::vector<Block*>& blocks);
  // A large block freed into the cache may still be read or written by work
  // queued on its stream before the free: its memory is released (unmapped)
  // or given to another stream only after that work. Not after the stream's
  // tail found then (the job's thread would wait for everything it has
  // queued since, losing its lead over the GPU, at every release of a cached
  // block): after the first mark recorded on its stream since the free, a
  // launch's (record_mark) or a fence recorded once kFreesPerFence blocks
  // freed on that stream wait for one.
  void freed(Block& b);
  // Taken from the cache for a new allocation: it waits for nothing more.
  void reused(Block& b);
  // The host waits for the work queued on `b`'s stream before its free: its
  // fence, or, with none yet, one recorded now at that stream's tail and
  // shared by every freed block waiting for one there. In stream order, a
  // reuse on another stream waits for the same: order_after_uses (a cached
  // block has no users left, its fence is its mark).
  CUresult wait_freed(Block& b);
  // Whether that work is known done (its fence has completed), not waiting.
  CUresult query_freed(const Block& b) const;
  // A prefetch's copy into `b` not yet swapped in (its mark on the H2D
  // stream), or null.
  const UseMark* arrival(const Block& b) const { return mark_of(b, h2d()); }
  // An eviction's copy was just queued on the D2H stream: mark its end.
  void mark_departure(Block& b);
  // Whether that copy is done (query), or the host waits for it; the D2H
  // stream's tail stands in for a mark that could not be recorded.
  CUresult departed(const Block& b) const;
  CUresult wait_departure(const Block& b);
  // `waiter` waits for that copy in stream order (nothing queued if it is
  // done already): a use that cancels an eviction must not write the device
  // copy while the copy still reads it.
  CUresult order_after_departure(CUstream waiter, const Block& b);
  void clear_departure(Block& b);
  // The mark at the end of `b`'s eviction copy, or of its prefetch copy,
  // kept out of the pool for a waiter without the allocator's lock (the
  // mover), who lets it go when done; null if it has none.
  UseMark* keep_departure(const Block& b) { return keep(b.departure); }
  UseMark* keep_arrival(const Block& b) { return keep(mark_of(b, h2d())); }
  void let_go(UseMark* m) { unref(m); }
  size_t marks_in_use() const { return marks_.size() - free_marks_.size(); }

 private:
  UseMark* mark_of(const Block& b, CUstream s) const;
  static UseMark* keep(UseMark* m) {
    if (m) ++m->refs;
    return m;
  }
  void unref(UseMark* m);

  CUresult wait_event(CUevent e, bool for_copies);

  const cu::Driver& d_;
  Stream d2h_, h2d_;
  Event ev_;
  uint64_t waited_ns_ = 0;  // under the allocator's lock, as every call here
  std::vector<std::unique_ptr<UseMark>> marks_;
  std::vector<UseMark*> free_marks_;
  // Freed blocks no mark has followed yet, by stream (freed).
  static constexpr size_t kFreesPerFence = 8;
  std::vector<std::pair<CUstream, std::vector<Block*>>> unfenced_;
  std::vector<Block*>* unfenced_on(CUstream s);
  void fence(CUstream s, UseMark* m);
};

}  // namespace spillway
