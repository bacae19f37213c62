// SPILLWAY_MODE=host (design.md 4.1): a large block's address range is
// remapped between device memory and pinned host memory, so its pointer never
// changes and an access nobody predicted reads host memory over the link:
// slow, correct.
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

class HostBacking final : public Backing {
 public:
  // Host handles are staged (vmm.h): an eviction's copy goes to the host
  // handle's own mapping, so starting one maps nothing.
  HostBacking(const BackingParts& p, bool evicts)
      : p_(p), host_(p.d, host_prop(p.d, p.device), &p.arena, p.device), evicts_(evicts) {}

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
    // Host memory counts against its budget whether in use or pooled.
    if (host_budget && !host_.has(b->cap)) {
      const size_t want = host_.held() + b->cap;
      if (want > host_budget) host_.trim(want - host_budget);
      if (host_.held() + b->cap > host_budget) {
        log::warn_repeated(host_full_,
                           "host budget of {} reached (SPILLWAY_HOST_BUDGET): block {:#x} ({}) "
                           "stays on the device",
                           format_bytes(host_budget), b->ptr, format_bytes(b->cap));
        return Start::kStop;
      }
    }
    CUmemGenericAllocationHandle h = 0;
    uintptr_t stage = 0;
    CUresult r = host_.take(b->cap, &h, &stage);
    if (r != CUDA_SUCCESS) {
      log::warn_repeated(host_unavailable_, "host memory for eviction ({}) unavailable: {}",
                         format_bytes(b->cap), cu::describe(p_.d, r));
      *failed = true;
      return Start::kStop;
    }
    // The copy goes into the host handle's staging mapping, on the D2H
    // stream, after the block's last use on each stream that used it.
    const CUstream d2h = p_.streams.d2h();
    if ((r = p_.streams.order_after_uses(d2h, *b)) != CUDA_SUCCESS ||
        (r = CU_CALL(p_.d, cuMemcpyDtoDAsync, stage, b->ptr, b->size, d2h)) != CUDA_SUCCESS) {
      log::warn("eviction copy of {:#x} failed: {}", b->ptr, cu::describe(p_.d, r));
      // A copy queued before the failure must end before the handle is reused.
      p_.streams.drain(d2h);
      host_.give(h, b->cap, stage);
      *failed = true;
      return Start::kFailed;
    }
    b->where = Block::Where::kEvicting;
    b->host = h;
    b->host_va = stage;
    return Start::kStarted;
  }

  bool finish_evict(Block* b, bool copied) override {
    // Swap the block's address to its host copy, unless the eviction was
    // cancelled or a step fails: then the device memory, still mapped and
    // intact, stays. The host handle keeps its staging mapping either way.
    bool swapped = false;
    if (copied && !b->cancel && CU_CALL(p_.d, cuMemUnmap, b->ptr, b->cap) == CUDA_SUCCESS) {
      swapped = map_rw(p_.d, b->ptr, b->cap, b->host, p_.device) == CUDA_SUCCESS;
      if (!swapped) map_rw(p_.d, b->ptr, b->cap, b->dev, p_.device);  // put the device memory back
    }
    if (swapped) {
      p_.dev.give(b->dev, b->cap);
      b->dev = 0;
      b->where = Block::Where::kHost;
    } else {
      give_host(b);
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
    uintptr_t scratch = p_.arena.take(b->cap);
    if (!scratch || (r = map_rw(p_.d, scratch, b->cap, h, p_.device)) != CUDA_SUCCESS) {
      if (scratch) p_.arena.give(scratch, b->cap);
      p_.dev.give(h, b->cap);
      return scratch ? r : CUDA_ERROR_OUT_OF_MEMORY;
    }
    // The host copy may have been written through its mapping by work queued
    // on any stream that uses the block: copy after all of it (its latest
    // use seen on each stream, copy_streams.h). The swap of
    // mappings below needs the copy done, so the host waits for it.
    const CUstream h2d = p_.streams.h2d();
    if ((r = p_.streams.order_after_uses(h2d, *b)) == CUDA_SUCCESS &&
        (r = CU_CALL(p_.d, cuMemcpyDtoDAsync, scratch, b->ptr, b->size, h2d)) == CUDA_SUCCESS)
      r = p_.streams.drain(h2d);
    bool ok = r == CUDA_SUCCESS && CU_CALL(p_.d, cuMemUnmap, scratch, b->cap) == CUDA_SUCCESS;
    bool unmapped = ok && CU_CALL(p_.d, cuMemUnmap, b->ptr, b->cap) == CUDA_SUCCESS;
    if (unmapped && (r = map_rw(p_.d, b->ptr, b->cap, h, p_.device)) == CUDA_SUCCESS) {
      p_.arena.give(scratch, b->cap);
      give_host(b);
      b->dev = h;
      b->where = Block::Where::kDevice;
      return CUDA_SUCCESS;
    }
    // Roll back: the host copy stays mapped at the block's address.
    if (unmapped) map_rw(p_.d, b->ptr, b->cap, b->host, p_.device);
    if (!ok) CU_CALL(p_.d, cuMemUnmap, scratch, b->cap);
    p_.arena.give(scratch, b->cap);
    p_.dev.give(h, b->cap);
    log::warn("restore of {:#x} failed: {}", b->ptr, cu::describe(p_.d, r));
    return r == CUDA_SUCCESS ? CUDA_ERROR_NOT_PERMITTED : r;
  }

  Start start_prefetch(Block* b) override {
    CUmemGenericAllocationHandle h = 0;
    // Room from pooled handles and cached blocks only: a prefetch never
    // evicts a live block.
    if (p_.room.take_device(b->cap, &h, false) != CUDA_SUCCESS) return Start::kStop;
    uintptr_t stage = p_.arena.take(b->cap);
    CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
    UseMark* m = nullptr;
    const CUstream h2d = p_.streams.h2d();
    // After every use of the host copy seen so far (its marks, or the tails
    // of streams without one), as a restore's copy.
    const bool mapped = stage && (r = map_rw(p_.d, stage, b->cap, h, p_.device)) == CUDA_SUCCESS;
    if (mapped && (r = p_.streams.order_after_uses(h2d, *b)) == CUDA_SUCCESS &&
        (r = CU_CALL(p_.d, cuMemcpyDtoDAsync, stage, b->ptr, b->size, h2d)) == CUDA_SUCCESS &&
        !(m = p_.streams.record_mark(h2d)))
      r = CUDA_ERROR_UNKNOWN;
    if (r != CUDA_SUCCESS) {
      if (mapped) {
        p_.streams.drain(h2d);  // a copy queued before the failure must end first
        CU_CALL(p_.d, cuMemUnmap, stage, b->cap);
      }
      if (stage) p_.arena.give(stage, b->cap);
      p_.dev.give(h, b->cap);
      log::warn("prefetch of {:#x} failed: {}", b->ptr, cu::describe(p_.d, r));
      return Start::kFailed;
    }
    // The copy's mark is the block's arrival: a copy or free of the block
    // waits for it like any other use (copy_streams.h).
    p_.streams.set_mark(*b, h2d, m);
    b->dev = h;
    b->scratch = stage;
    b->where = Block::Where::kArriving;
    return Start::kStarted;
  }

  bool finish_prefetch(Block* b, bool wait) override {
    const UseMark* m = p_.streams.arrival(*b);
    if (!m) return false;
    CUresult r =
        wait ? CU_CALL(p_.d, cuEventSynchronize, m->ev.get()) : p_.d.cuEventQuery(m->ev.get());
    if (r == CUDA_ERROR_NOT_READY) return false;
    if (r != CUDA_SUCCESS) {
      abort_prefetch(b);
      return false;
    }
    // The copy is done, and no seen work used the host mapping since it
    // was queued (a seen use swaps first): the address can move to it.
    bool unmapped = false;
    if (CU_CALL(p_.d, cuMemUnmap, b->scratch, b->cap) == CUDA_SUCCESS) {
      p_.arena.give(b->scratch, b->cap);
      b->scratch = 0;
      unmapped = CU_CALL(p_.d, cuMemUnmap, b->ptr, b->cap) == CUDA_SUCCESS;
    }
    if (unmapped && map_rw(p_.d, b->ptr, b->cap, b->dev, p_.device) == CUDA_SUCCESS) {
      give_host(b);
      p_.streams.clear_mark(*b, p_.streams.h2d());
      b->where = Block::Where::kDevice;
      return true;
    }
    // Back to the host copy, whole; the device copy is dropped.
    if (unmapped) map_rw(p_.d, b->ptr, b->cap, b->host, p_.device);
    drop_device_copy(b);
    log::warn("prefetch of {:#x} could not be swapped in; it stays on the host", b->ptr);
    return false;
  }

  void abort_prefetch(Block* b) override {
    // The copy reads the host copy and writes the device one: it ends first.
    if (const UseMark* m = p_.streams.arrival(*b)) CU_CALL(p_.d, cuEventSynchronize, m->ev.get());
    drop_device_copy(b);
  }

  bool release(Block* b) override {
    if (CU_CALL(p_.d, cuMemUnmap, b->ptr, b->cap) != CUDA_SUCCESS) return false;
    if (b->where == Block::Where::kHost)
      give_host(b);
    else
      p_.dev.give(b->dev, b->cap);
    p_.arena.give(b->ptr, b->cap);
    p_.table.forget(b);
    return true;
  }

  void release_all() override {
    // Every mapping in the arena goes, and its memory back to the pools,
    // which release it; then the arena's range can be freed.
    for (const auto& owned : p_.table.all()) {
      const Block* b = owned.get();
      if (!b->large) continue;
      CU_CALL(p_.d, cuMemUnmap, b->ptr, b->cap);
      if (b->scratch) CU_CALL(p_.d, cuMemUnmap, b->scratch, b->cap);
      if (b->dev) p_.dev.give(b->dev, b->cap);
      if (b->host) host_.give(b->host, b->cap, b->host_va);
    }
  }

  uint64_t host_held() const override { return host_.held(); }
  uint64_t added_by(size_t need) const override { return p_.dev.has(need) ? 0 : need; }
  uint64_t host_creates() const override { return host_.creates(); }
  uint64_t host_reserved() const override { return host_.held() - host_.pooled(); }

 private:
  // The host handle back to its pool, its staging mapping kept.
  void give_host(Block* b) {
    host_.give(b->host, b->cap, b->host_va);
    b->host = 0;
    b->host_va = 0;
  }

  // kArriving -> kHost, its copy done: the device copy and its staging
  // mapping go back.
  void drop_device_copy(Block* b) {
    if (b->scratch && CU_CALL(p_.d, cuMemUnmap, b->scratch, b->cap) == CUDA_SUCCESS)
      p_.arena.give(b->scratch, b->cap);  // else its VA leaks, never aliased
    b->scratch = 0;
    p_.dev.give(b->dev, b->cap);
    b->dev = 0;
    p_.streams.clear_mark(*b, p_.streams.h2d());
    b->where = Block::Where::kHost;
  }

  BackingParts p_;
  log::Repeats host_full_, host_unavailable_;
  PhysPool host_;
  const bool evicts_;
};

}  // namespace

std::unique_ptr<Backing> make_host_backing(const BackingParts& parts, bool evicts) {
  return std::make_unique<HostBacking>(parts, evicts);
}

}  // namespace spillway
