// SPILLWAY_MODE=managed (design.md 4.2): each large block is its own
// cuMemAllocManaged allocation, evicted by a prefetch to the host and
// restored by a prefetch to the device; a missed prediction becomes page
// faults: slow, correct. Small-block chunks stay VMM device memory.
//
// One allocation per block rather than blocks carved from one big managed
// arena: a kernel touching an arena would, on the simulator, migrate all of
// it (it sees pointers, not extents), and a released block can simply be
// freed (cuMemFree: no byte moved) where an arena range would need a
// prefetch of its garbage to the host. The price is a driver call per new
// block (cached blocks are reused, so a repeated step makes none) and an
// ordered map to find a block from an address outside the arena.
#include "backing.h"
#include "log.h"

namespace spillway {
namespace {

class ManagedBacking final : public Backing {
 public:
  explicit ManagedBacking(const BackingParts& p) : p_(p) {}

  bool evicts() const override { return true; }

  Block* create(size_t cap, CUstream stream) override {
    if (!take_device(cap)) return nullptr;
    CUdeviceptr ptr = 0;
    // Asked twice, as a device create is (docs/reliability.md, "Driver
    // failures"): a failure the driver does not repeat costs a call, not an
    // allocation.
    CUresult r = CU_CALL(p_.d, cuMemAllocManaged, &ptr, cap, CU_MEM_ATTACH_GLOBAL);
    if (r != CUDA_SUCCESS) r = CU_CALL(p_.d, cuMemAllocManaged, &ptr, cap, CU_MEM_ATTACH_GLOBAL);
    if (r != CUDA_SUCCESS) {
      beyond_pool_ -= cap;
      log::error("cuMemAllocManaged of {} bytes on device {} failed: {}", cap, p_.device,
                 cu::describe(p_.d, r));
      return nullptr;
    }
    // Placed on the device on the allocating stream: its first use there
    // does not fault, and no one waits. A capturing stream would record the
    // prefetch into its graph: the copy stream does it then, and the host
    // waits.
    const bool capturing = p_.streams.not_capturing(stream) != CUDA_SUCCESS;
    r = prefetch(ptr, cap, true, capturing ? p_.streams.h2d() : stream);
    if (r == CUDA_SUCCESS && capturing) r = p_.streams.drain(p_.streams.h2d());
    // Not a reason to fail the allocation (contract 4): untouched managed
    // pages are populated where the GPU first touches them, at the cost of
    // faults.
    if (r != CUDA_SUCCESS)
      log::warn(
          "placing {} managed bytes at {:#x} on device {} failed ({}): its first use faults "
          "them in",
          cap, ptr, p_.device, cu::describe(p_.d, r));
    return p_.table.make_large(ptr, cap, stream);
  }

  Start start_evict(Block* b, uint64_t host_budget, bool* failed) override {
    if (host_budget && host_ + b->cap > host_budget) {
      log::warn("host budget of {} bytes reached: block {:#x} ({} bytes) stays on the device",
                host_budget, b->ptr, b->cap);
      return Start::kStop;
    }
    // After everything already queued on the streams that use it, so no
    // queued kernel faults its pages straight back.
    const CUstream d2h = p_.streams.d2h();
    CUresult r = p_.streams.order_after_uses(d2h, *b);
    if (r == CUDA_SUCCESS) r = prefetch(b->ptr, b->cap, false, d2h);
    if (r != CUDA_SUCCESS) {
      log::warn("eviction prefetch of {:#x} failed: {}", b->ptr, cu::describe(p_.d, r));
      *failed = true;
      return Start::kFailed;
    }
    host_ += b->cap;
    b->where = Block::Where::kEvicting;
    return Start::kStarted;
  }

  bool finish_evict(Block* b, bool copied) override {
    // The prefetch has moved the pages; nothing to swap.
    if (copied && !b->cancel) {
      beyond_pool_ -= b->cap;
      b->where = Block::Where::kHost;
      return true;
    }
    // Cancelled (or not known to be done): the block counts as resident, so
    // its pages go back, on d2h behind the eviction's prefetch. Meanwhile a
    // GPU access faults them in: slow, correct.
    host_ -= b->cap;
    prefetch(b->ptr, b->cap, true, p_.streams.d2h());
    b->where = Block::Where::kDevice;
    return false;
  }

  void cancel_evict(Block* b, const CUstream* consumer) override {
    // The prefetch may be moving its pages out right now. The consumer waits
    // for it and brings them back first rather than faulting them back
    // (finish_evict would bring them back too, later).
    if (!consumer) return;
    if (p_.streams.order_after(*consumer, p_.streams.d2h()) != CUDA_SUCCESS ||
        p_.streams.not_capturing(*consumer) != CUDA_SUCCESS)
      return;
    prefetch(b->ptr, b->cap, true, *consumer);
  }

  CUresult restore(Block* b, const CUstream* consumer) override {
    if (!take_device(b->cap)) return CUDA_ERROR_OUT_OF_MEMORY;
    // After the work queued on the block's streams, which may still touch
    // its host pages, so the migration does not race it. The consumer waits
    // for the prefetch in stream order: unlike a remap, nothing here needs
    // the host to wait, except for a holder with no stream (or a capturing
    // consumer).
    const CUstream h2d = p_.streams.h2d();
    CUresult r = p_.streams.order_after_uses(h2d, *b);
    if (r == CUDA_SUCCESS) r = prefetch(b->ptr, b->cap, true, h2d);
    if (r == CUDA_SUCCESS && (!consumer || p_.streams.not_capturing(*consumer) != CUDA_SUCCESS ||
                              p_.streams.order_after(*consumer, h2d) != CUDA_SUCCESS))
      r = p_.streams.drain(h2d);
    if (r != CUDA_SUCCESS) {
      // Still counted on the host; a GPU access faults its pages in.
      beyond_pool_ -= b->cap;
      log::warn("restore of {:#x} failed: {}", b->ptr, cu::describe(p_.d, r));
      return r;
    }
    host_ -= b->cap;
    b->where = Block::Where::kDevice;
    return CUDA_SUCCESS;
  }

  bool release(Block* b) override {
    // cuMemFree gives back the device pages (and any host ones) without
    // moving a byte: cheaper than a prefetch of its garbage to the host. It
    // waits for work still using the block, which the callers have drained.
    if (CU_CALL(p_.d, cuMemFree, static_cast<CUdeviceptr>(b->ptr)) != CUDA_SUCCESS) return false;
    if (b->where == Block::Where::kHost)
      host_ -= b->cap;
    else
      beyond_pool_ -= b->cap;
    p_.table.forget(b);
    return true;
  }

  void release_all() override {
    for (auto& [ptr, b] : p_.table.outside())
      CU_CALL(p_.d, cuMemFree, static_cast<CUdeviceptr>(ptr));
  }

  uint64_t host_held() const override { return host_; }
  // A managed block is never served by a pooled handle: counted in full (a
  // little early for a small chunk).
  uint64_t added_by(size_t need) const override { return need; }
  uint64_t host_reserved() const override { return host_; }

 private:
  // Room in the budget for `size` more resident bytes. Nothing to create
  // here: the pages come with the prefetch that follows. A device fuller
  // than the budget says is the driver's to handle (it migrates managed
  // pages out itself): slow, correct.
  bool take_device(size_t size) {
    if (!p_.room.make_room(size, true)) return false;
    beyond_pool_ += size;
    return true;
  }
  CUresult prefetch(uintptr_t ptr, size_t n, bool to_device, CUstream s) {
    CUmemLocation loc{};
    loc.type = to_device ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST;
    loc.id = to_device ? p_.device : 0;
    return CU_CALL(p_.d, cuMemPrefetchAsync, static_cast<CUdeviceptr>(ptr), n, loc, 0u, s);
  }

  BackingParts p_;
  // beyond_pool_: managed blocks placed on the device and not since moved out.
  uint64_t host_ = 0;  // managed blocks moved (or moving) to the host
};

}  // namespace

std::unique_ptr<Backing> make_managed_backing(const BackingParts& parts) {
  return std::make_unique<ManagedBacking>(parts);
}

}  // namespace spillway
