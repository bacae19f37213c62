// SPILLWAY_MODE=host (design.md 4.1): a large block's address range is
// remapped between device memory and pinned host memory, so its pointer never
// changes and an access nobody predicted reads host memory over the link:
// slow, correct.
//
// A block's host memory is made of pieces of a few sizes (kPiece, and one
// tail below it), mapped one after another at its address, so that a freed
// piece serves any later block: creating host memory pins and clears its
// pages (3.2 GB/s on an H200, docs/gpu.md check (e)), so a pool keyed by
// each block's exact size made every eviction of a new size pay that on the
// evicting thread.
#include <algorithm>
#include <unordered_map>

#include "backing.h"
#include "log.h"
#include "size.h"

namespace spillway {
namespace {

CUmemAllocationProp host_prop(const cu::Driver& d, int device) {
  // Host memory on the GPU's own NUMA node, so that copies do not cross
  // sockets; plain HOST if it has none.
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  CUdevice dev = 0;
  int numa = -1;
  if (d.cuDeviceGet(&dev, device) != CUDA_SUCCESS ||
      d.cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev) != CUDA_SUCCESS)
    numa = -1;
  p.location.type = numa >= 0 ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_HOST;
  p.location.id = numa >= 0 ? numa : 0;
  return p;
}

// The host pieces' sizes (a granule multiple, as every block's cap).
constexpr size_t kPiece = 64ull << 20;

// The ranges of a block that hold live bytes, as offsets [lo, hi) in address
// order, each widened to a multiple of `align` (1: exact) within its
// capacity: of a block of one, its bytes from its start; of a split block,
// its allocations' (neighbours merged). `f(lo, hi)` returns a CUresult; the
// first failure stops. Widened to granules they are what gets host memory
// when the block is evicted: a block taken for a smaller request, or a split
// block with one small allocation left, would otherwise cost host memory
// (created at 3.2 GB/s on an H200) for its whole capacity.
template <class F>
CUresult for_each_live_range(const Block* b, size_t align, F&& f) {
  auto down = [&](size_t v) { return v / align * align; };
  auto up = [&](size_t v) { return std::min((v + align - 1) / align * align, b->cap); };
  if (b->parts.empty()) return b->size ? f(size_t{0}, up(b->size)) : CUDA_SUCCESS;
  size_t lo = 0, hi = 0;
  for (const auto& [p, n] : b->parts) {
    const size_t from = down(p - b->ptr), to = up(p - b->ptr + n);
    if (hi > lo && from > hi) {
      if (CUresult r = f(lo, hi); r != CUDA_SUCCESS) return r;
      lo = from;
    } else if (hi == lo) {
      lo = from;
    }
    hi = std::max(hi, to);
  }
  return hi > lo ? f(lo, hi) : CUDA_SUCCESS;
}

// The host pieces of a block, in address order, as `f(offset, bytes)`: each
// kept range cut into whole pieces, then its rest.
template <class F>
void for_each_piece(const Block* b, size_t granule, F&& f) {
  for_each_live_range(b, granule, [&](size_t lo, size_t hi) {
    for (size_t off = lo; off < hi; off += kPiece) f(off, std::min(kPiece, hi - off));
    return CUDA_SUCCESS;
  });
}

class HostBacking final : public Backing {
 public:
  // Host handles are staged when created (vmm.h): an eviction's copy goes
  // to the host handle's own mapping, so starting one maps nothing. Device
  // handles are staged when a restore or prefetch first copies into one,
  // and stay so while pooled: a restore then remaps the block's range alone
  // (3 VMM calls, not 6) and a prefetch's start maps nothing.
  HostBacking(const BackingParts& p, bool evicts)
      : p_(p),
        host_(p.d, host_prop(p.d, p.device), &p.arena, p.device, /*stage_on_create=*/true),
        evicts_(evicts) {}

  bool evicts() const override { return evicts_; }

  Block* create(size_t cap, CUstream stream) override {
    CUmemGenericAllocationHandle h = 0;
    if (p_.room.take_device(cap, &h, true) != CUDA_SUCCESS) return nullptr;
    uintptr_t va = p_.arena.take(cap);
    if (!va) {
      log::error("the VA arena ({} bytes) is exhausted", p_.arena.size());
      p_.dev.give(h, cap);
      return nullptr;
    }
    if (CUresult r = map_rw(p_.d, va, cap, h, p_.device); r != CUDA_SUCCESS) {
      log::error("mapping {} bytes at {:#x} failed: {}", cap, va, cu::describe(p_.d, r));
      p_.arena.give(va, cap);
      p_.dev.give(h, cap);
      return nullptr;
    }
    Block* b = p_.table.make_large(va, cap, stream);
    b->dev = h;
    return b;
  }

  Start start_evict(Block* b, uint64_t host_budget, bool* failed) override {
    // Its copy would read an address with nothing mapped: a fault that
    // stops the whole context (CUDA_ERROR_ILLEGAL_ADDRESS is sticky).
    if (!remap(b)) {
      *failed = true;
      return Start::kFailed;
    }
    // Host memory counts against its budget whether in use or pooled.
    if (host_budget) {
      size_t added = bytes_to_create(b);
      if (added && host_.held() + added > host_budget) {
        host_.trim(host_.held() + added - host_budget);
        added = bytes_to_create(b);  // the trim may have taken pieces counted on
      }
      if (added && host_.held() + added > host_budget) {
        log::warn_repeated(host_full_,
                           "host budget of {} reached (SPILLWAY_HOST_BUDGET): block {:#x} ({}) "
                           "stays on the device",
                           format_bytes(host_budget), b->ptr, format_bytes(b->cap));
        return Start::kStop;
      }
    }
    CUresult r = CUDA_SUCCESS;
    size_t kept = 0;
    for_each_piece(b, granule(), [&](size_t off, size_t size) {
      Block::HostPiece piece{0, 0, off, size};
      if (r == CUDA_SUCCESS && (r = host_.take(size, &piece.h, &piece.va)) == CUDA_SUCCESS) {
        b->host.push_back(piece);
        kept += size;
      }
    });
    if (r != CUDA_SUCCESS) {
      give_host(b);
      log::warn_repeated(host_unavailable_, "host memory for eviction ({}) unavailable: {}",
                         format_bytes(kept), cu::describe(p_.d, r));
      *failed = true;
      return Start::kStop;
    }
    // The copy goes into the host pieces' staging mappings, on the D2H
    // stream, after the block's last use on each stream that used it.
    const CUstream d2h = p_.streams.d2h();
    const bool ordered = (r = p_.streams.order_after_uses(d2h, *b)) == CUDA_SUCCESS;
    if (ordered)
      r = for_each_copy(
          b, [&](const Block::HostPiece& piece, size_t in_piece, size_t off, size_t n) {
            return CU_CALL(p_.d, cuMemcpyDtoDAsync, piece.va + in_piece, b->ptr + off, n, d2h);
          });
    if (r != CUDA_SUCCESS) {
      log::warn("eviction copy of {:#x} failed: {}", b->ptr, cu::describe(p_.d, r));
      // A copy queued before the failure must end before the pieces are reused.
      if (CUresult w = ordered ? p_.streams.drain(d2h) : CUDA_SUCCESS; w != CUDA_SUCCESS)
        keep_host(b, cu::describe(p_.d, w));
      else
        give_host(b);
      *failed = true;
      return Start::kFailed;
    }
    b->where = Block::Where::kEvicting;
    return Start::kStarted;
  }

  bool finish_evict(Block* b, bool copied) override {
    // Swap the block's address to its host copy, unless the eviction was
    // cancelled or a step fails: then the device memory, still mapped and
    // intact, stays. The host pieces keep their staging mappings either way.
    bool swapped = false;
    if (copied && !b->cancel && CU_CALL(p_.d, cuMemUnmap, b->ptr, b->cap) == CUDA_SUCCESS) {
      swapped = map_host(b);
      // Put the device memory back; if even that fails, the block keeps it,
      // unmapped (both copies are whole: the copy was done and not cancelled).
      if (!swapped && map_rw(p_.d, b->ptr, b->cap, b->dev, p_.device) != CUDA_SUCCESS)
        left_unmapped(b, "eviction");
    }
    if (swapped) {
      p_.dev.give(b->dev, b->cap);
      b->dev = 0;
      b->where = Block::Where::kHost;
    } else {
      // Not known to be copied: the copy may still be writing the pieces.
      if (copied)
        give_host(b);
      else
        keep_host(b, "the wait or query on it failed");
      b->where = Block::Where::kDevice;
    }
    return swapped;
  }

  void cancel_evict(Block* b, const CUstream* consumer) override {
    // Its device memory is still mapped and current: it stays. But the copy
    // may still be reading it, and the use may write it: the use waits for
    // the copy (on the GPU; the host for a holder without a stream), else
    // the two race (the copy's result is dropped, but a write concurrent
    // with a read is a data race all the same: seen by ThreadSanitizer in
    // the simulator, where copies and kernels are threads).
    if (consumer && p_.streams.not_capturing(*consumer) == CUDA_SUCCESS &&
        p_.streams.order_after_departure(*consumer, *b) == CUDA_SUCCESS)
      return;
    p_.streams.wait_departure(*b);
  }

  CUresult restore(Block* b, const CUstream* /*consumer*/) override {
    CUmemGenericAllocationHandle h = 0;
    CUresult r = p_.room.take_device(b->cap, &h, true);
    if (r != CUDA_SUCCESS) return r;
    uintptr_t stage = 0;
    if ((r = p_.dev.stage(h, b->cap, &stage)) != CUDA_SUCCESS) {
      p_.dev.give(h, b->cap);
      return r;
    }
    // The host copy may have been written through its mapping by work queued
    // on any stream that uses the block: copy after all of it (its latest
    // use seen on each stream, copy_streams.h), into the device handle's
    // staging mapping. The swap of mappings below needs the copy done, so
    // the host waits for it.
    const CUstream h2d = p_.streams.h2d();
    const bool ordered = (r = p_.streams.order_after_uses(h2d, *b)) == CUDA_SUCCESS;
    if (ordered) r = copy_from_host(b, stage, h2d);
    // The copy, or the pieces' copies queued before its failure, must end
    // before the handle is swapped in or given back.
    if (CUresult w = ordered ? p_.streams.drain(h2d) : CUDA_SUCCESS; w != CUDA_SUCCESS) {
      keep_device(h, b->cap, w);
      log::warn("restore of {:#x} failed: {}", b->ptr, cu::describe(p_.d, w));
      return w;
    }
    const bool off = r == CUDA_SUCCESS && (b->unmapped || unmap_host(b));
    if (off && (r = map_rw(p_.d, b->ptr, b->cap, h, p_.device)) == CUDA_SUCCESS) {
      give_host(b);
      b->dev = h;
      b->where = Block::Where::kDevice;
      b->unmapped = false;
      return CUDA_SUCCESS;
    }
    // Roll back: the host copy stays mapped at the block's address.
    if (off) {
      b->unmapped = false;
      if (!map_host(b)) left_unmapped(b, "restore");
    }
    p_.dev.give(h, b->cap);
    log::warn("restore of {:#x} failed: {}", b->ptr,
              r == CUDA_SUCCESS ? std::string("its host copy could not be unmapped")
                                : cu::describe(p_.d, r));
    return r == CUDA_SUCCESS ? CUDA_ERROR_NOT_PERMITTED : r;
  }

  Start start_prefetch(Block* b) override {
    CUmemGenericAllocationHandle h = 0;
    // Room from pooled handles and cached blocks only: a prefetch never
    // evicts a live block.
    if (p_.room.take_device(b->cap, &h, false) != CUDA_SUCCESS) return Start::kStop;
    uintptr_t stage = 0;
    UseMark* m = nullptr;
    const CUstream h2d = p_.streams.h2d();
    // After every use of the host copy seen so far (its marks, or the tails
    // of streams without one), as a restore's copy.
    CUresult r = p_.dev.stage(h, b->cap, &stage);
    const bool ordered =
        r == CUDA_SUCCESS && (r = p_.streams.order_after_uses(h2d, *b)) == CUDA_SUCCESS;
    if (ordered && (r = copy_from_host(b, stage, h2d)) == CUDA_SUCCESS &&
        !(m = p_.streams.record_mark(h2d)))
      r = CUDA_ERROR_UNKNOWN;
    if (r != CUDA_SUCCESS) {
      // A copy queued before the failure must end first.
      if (CUresult w = ordered ? p_.streams.drain(h2d) : CUDA_SUCCESS; w != CUDA_SUCCESS)
        keep_device(h, b->cap, w);
      else
        p_.dev.give(h, b->cap);
      log::warn("prefetch of {:#x} failed: {}", b->ptr, cu::describe(p_.d, r));
      return Start::kFailed;
    }
    // The copy's mark is the block's arrival: a copy or free of the block
    // waits for it like any other use (copy_streams.h).
    p_.streams.set_mark(*b, h2d, m);
    b->dev = h;
    b->where = Block::Where::kArriving;
    return Start::kStarted;
  }

  bool finish_prefetch(Block* b, bool wait) override {
    const UseMark* m = p_.streams.arrival(*b);
    if (!m) return false;
    CUresult r = wait ? p_.streams.wait(*m) : p_.d.cuEventQuery(m->ev.get());
    if (r == CUDA_ERROR_NOT_READY) return false;
    if (r != CUDA_SUCCESS) {
      abort_prefetch(b);
      return false;
    }
    // The copy is done, and no seen work used the host mapping since it
    // was queued (a seen use swaps first): the address can move to it.
    const bool off = b->unmapped || unmap_host(b);
    if (off && map_rw(p_.d, b->ptr, b->cap, b->dev, p_.device) == CUDA_SUCCESS) {
      give_host(b);
      p_.streams.clear_mark(*b, p_.streams.h2d());
      b->where = Block::Where::kDevice;
      b->unmapped = false;
      return true;
    }
    // Back to the host copy, whole; the device copy is dropped.
    b->unmapped = false;
    const bool lost = off && !map_host(b);
    drop_device_copy(b);
    if (lost) left_unmapped(b, "prefetch");
    log::warn("prefetch of {:#x} could not be swapped in; it stays on the host", b->ptr);
    return false;
  }

  void abort_prefetch(Block* b) override {
    // The copy reads the host copy and writes the device one: it ends first.
    const UseMark* m = p_.streams.arrival(*b);
    drop_device_copy(b, m ? p_.streams.wait(*m) : CUDA_SUCCESS);
  }

  bool release(Block* b) override {
    if (b->where == Block::Where::kHost) {
      if (!b->unmapped && !unmap_host(b)) return false;
      give_host(b);
    } else {
      if (!b->unmapped && CU_CALL(p_.d, cuMemUnmap, b->ptr, b->cap) != CUDA_SUCCESS) return false;
      p_.dev.give(b->dev, b->cap);
    }
    p_.arena.give(b->ptr, b->cap);
    p_.table.forget(b);
    return true;
  }

  void release_all() override {
    // Every mapping in the arena goes, and its memory back to the pools,
    // which release it; then the arena's range can be freed.
    for (const auto& owned : p_.table.all()) {
      Block* b = owned.get();
      if (!b->large) continue;
      if (!b->unmapped) {
        if (b->where == Block::Where::kHost || b->where == Block::Where::kArriving)
          unmap_host(b);
        else
          CU_CALL(p_.d, cuMemUnmap, b->ptr, b->cap);
      }
      if (b->dev) p_.dev.give(b->dev, b->cap);
      give_host(b);
    }
    // The context was synchronized first (~Allocator): memory kept out of
    // use goes to the driver with the pools, never to another block.
    for (const auto& [h, cap] : kept_dev_) p_.dev.give(h, cap);
    for (const Block::HostPiece& piece : kept_host_) host_.give(piece.h, piece.size);
    kept_dev_.clear();
    kept_host_.clear();
  }

  size_t grow_host_reserve(size_t target, uint64_t host_budget,
                           std::unique_lock<std::mutex>& lock) override {
    size_t made = 0;
    // One piece per call: the caller's thread comes back to check the
    // budget and whether it is stopping.
    if (host_.count(kPiece) * kPiece < target &&
        (host_budget == 0 || host_.held() + kPiece <= host_budget)) {
      const uintptr_t va = p_.arena.take(kPiece);
      if (!va) return 0;
      // Pinning and clearing the pages takes tens of milliseconds a piece:
      // not under the lock the job's allocations take.
      lock.unlock();
      CUmemGenericAllocationHandle h = 0;
      CUresult r = CU_CALL(p_.d, cuMemCreate, &h, kPiece, &host_.prop(), 0);
      if (r == CUDA_SUCCESS && (r = map_rw(p_.d, va, kPiece, h, p_.device)) != CUDA_SUCCESS)
        CU_CALL(p_.d, cuMemRelease, h);
      lock.lock();
      if (r != CUDA_SUCCESS) {
        p_.arena.give(va, kPiece);
        log::warn_repeated(host_unavailable_, "host memory created ahead ({}) unavailable: {}",
                           format_bytes(kPiece), cu::describe(p_.d, r));
        return 0;
      }
      // Evictions may have created host memory meanwhile.
      if (host_budget && host_.held() + kPiece > host_budget) {
        CU_CALL(p_.d, cuMemUnmap, va, kPiece);
        p_.arena.give(va, kPiece);
        CU_CALL(p_.d, cuMemRelease, h);
        return 0;
      }
      host_.adopt(h, kPiece, va);
      made += kPiece;
    }
    return made;
  }

  bool remap(Block* b) override {
    if (!b->unmapped) return true;
    const bool mapped = b->where == Block::Where::kHost
                            ? map_host(b)
                            : map_rw(p_.d, b->ptr, b->cap, b->dev, p_.device) == CUDA_SUCCESS;
    if (mapped) {
      b->unmapped = false;
      log::info("block {:#x} is mapped again", b->ptr);
    }
    return mapped;
  }

  uint64_t host_held() const override { return host_.held(); }
  uint64_t added_by(size_t need) const override { return p_.dev.has(need) ? 0 : need; }
  uint64_t host_creates() const override { return host_.creates(); }
  uint64_t host_reserved() const override { return host_.held() - host_.pooled(); }

 private:
  // A swap of mappings (`what`) and its rollback both failed: the block
  // keeps its bytes where it is, with nothing mapped at its address.
  void left_unmapped(Block* b, const char* what) {
    b->unmapped = true;
    log::error(
        "{} of {:#x}: neither its device memory nor its host copy could be mapped at its "
        "address; work that uses it before spillway maps it again faults (its {} bytes are kept "
        "in {} memory)",
        what, b->ptr, b->cap, b->where == Block::Where::kHost ? "host" : "device");
  }

  // A copy that could not be waited for may still be writing this memory:
  // it stays out of use, counted as held, rather than serve another block
  // under that copy. (A driver that fails waits has failed for good, as a
  // sticky error does; what it costs is room, never a byte.)
  void keep_device(CUmemGenericAllocationHandle h, size_t cap, CUresult why) {
    kept_dev_.emplace_back(h, cap);
    kept_ += cap;
    log::error_repeated(kept_device_log_,
                        "a copy into {} of device memory cannot be waited for ({}); that memory "
                        "is kept out of use ({} kept so far)",
                        format_bytes(cap), cu::describe(p_.d, why), format_bytes(kept_));
  }
  void keep_host(Block* b, const std::string& why) {
    size_t n = 0;
    for (const Block::HostPiece& piece : b->host) {
      n += piece.size;
      kept_host_.push_back(piece);
    }
    b->host.clear();
    kept_ += n;
    log::error_repeated(kept_host_log_,
                        "the eviction copy of {:#x} cannot be waited for ({}); its {} of host "
                        "memory are kept out of use ({} kept so far)",
                        b->ptr, why, format_bytes(n), format_bytes(kept_));
  }

  // The host pieces back to their pool, their staging mappings kept.
  void give_host(Block* b) {
    for (const Block::HostPiece& piece : b->host) host_.give(piece.h, piece.size);
    b->host.clear();
  }

  size_t granule() const { return p_.arena.granule(); }

  // Host bytes evicting `b` would create: the pieces the pool does not hold.
  size_t bytes_to_create(const Block* b) const {
    std::unordered_map<size_t, size_t> wanted;  // pieces by size
    for_each_piece(b, granule(), [&](size_t, size_t size) { ++wanted[size]; });
    size_t n = 0;
    for (const auto& [size, count] : wanted)
      if (count > host_.count(size)) n += (count - host_.count(size)) * size;
    return n;
  }

  // The host pieces mapped at their offsets in the block's range, read and
  // write for the device; all or none. The rest of the range stays unmapped
  // while the block is away: no live allocation is there (its spare room is
  // handed out only while the block is on the device).
  bool map_host(Block* b) {
    for (size_t i = 0; i < b->host.size(); ++i) {
      const Block::HostPiece& piece = b->host[i];
      if (map_rw(p_.d, b->ptr + piece.off, piece.size, piece.h, p_.device) != CUDA_SUCCESS) {
        unmap_first(b, i);
        return false;
      }
    }
    return true;
  }

  // Unmaps the block's first `count` host pieces. All or none: on a failure
  // those already unmapped are mapped again, so that the block stays whole
  // on the host.
  bool unmap_first(Block* b, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      const Block::HostPiece& piece = b->host[i];
      if (CU_CALL(p_.d, cuMemUnmap, b->ptr + piece.off, piece.size) != CUDA_SUCCESS) {
        for (size_t j = 0; j < i; ++j)
          map_rw(p_.d, b->ptr + b->host[j].off, b->host[j].size, b->host[j].h, p_.device);
        return false;
      }
    }
    return true;
  }
  bool unmap_host(Block* b) { return unmap_first(b, b->host.size()); }

  // The block's bytes, read through its host mapping piece by piece (a copy
  // stays within one mapping), into `dst` on `stream`. Through the block's
  // address, where the trace finds each copy of a move (chrome_trace.cpp,
  // Join); but through the pieces' staging mappings, of the same host
  // memory, when a swap and its rollback both failed left nothing mapped
  // there (left_unmapped): a copy reading it would fault the whole context
  // (CI, session 25: the fault matrix's row cuMemSetAccess:132+).
  CUresult copy_from_host(const Block* b, uintptr_t dst, CUstream stream) {
    return for_each_copy(b,
                         [&](const Block::HostPiece& piece, size_t in_piece, size_t off, size_t n) {
                           const uintptr_t src = b->unmapped ? piece.va + in_piece : b->ptr + off;
                           return CU_CALL(p_.d, cuMemcpyDtoDAsync, dst + off, src, n, stream);
                         });
  }

  // The copies that move a block: its bytes from its start to `size`, or of
  // a split block its allocations' ranges alone (what its spare room holds is
  // dead), each cut at the host pieces' bounds (the pieces cover them all:
  // for_each_live_range). `copy(piece, offset in the piece, offset in the block,
  // bytes)`; stops at the first failure.
  template <class Copy>
  CUresult for_each_copy(const Block* b, Copy&& copy) {
    auto range = [&](size_t lo, size_t hi) {
      for (const Block::HostPiece& piece : b->host) {
        const size_t from = std::max(lo, piece.off), to = std::min(hi, piece.off + piece.size);
        if (from < to)
          if (CUresult r = copy(piece, from - piece.off, from, to - from); r != CUDA_SUCCESS)
            return r;
        if (piece.off + piece.size >= hi) break;
      }
      return CUDA_SUCCESS;
    };
    return for_each_live_range(b, 1, range);
  }

  // kArriving -> kHost: the device copy goes back to the pool (staged) once
  // its copy is done (`waited`), else it is kept out of use.
  void drop_device_copy(Block* b, CUresult waited = CUDA_SUCCESS) {
    if (waited == CUDA_SUCCESS)
      p_.dev.give(b->dev, b->cap);
    else
      keep_device(b->dev, b->cap, waited);
    b->dev = 0;
    p_.streams.clear_mark(*b, p_.streams.h2d());
    b->where = Block::Where::kHost;
  }

  BackingParts p_;
  log::Repeats host_full_, host_unavailable_, kept_device_log_, kept_host_log_;
  // Memory kept out of use (keep_device, keep_host), released at the end.
  std::vector<std::pair<CUmemGenericAllocationHandle, size_t>> kept_dev_;
  std::vector<Block::HostPiece> kept_host_;
  uint64_t kept_ = 0;  // their bytes
  PhysPool host_;
  const bool evicts_;
};

}  // namespace

std::unique_ptr<Backing> make_host_backing(const BackingParts& parts, bool evicts) {
  return std::make_unique<HostBacking>(parts, evicts);
}

}  // namespace spillway
