#include "allocator.h"

#include <algorithm>

#include "log.h"
#include "schedule.h"

namespace spillway {

struct Allocator::Block {
  enum class Where : uint8_t {
    kDevice,    // device memory mapped at ptr
    kEvicting,  // device memory still mapped; a copy to `host` (at `scratch`) in flight
    kHost,      // host memory mapped at ptr
  };
  uintptr_t ptr = 0;
  size_t size = 0;  // requested bytes while live
  size_t cap = 0;   // bytes behind it: a granule multiple for large blocks
  CUstream stream = nullptr;
  std::vector<CUstream> users;  // other streams seen using it (contract 3)
  bool large = false;
  bool live = false;
  Where where = Where::kDevice;
  bool cancel = false;  // kEvicting: used or freed meanwhile, keep the device copy
  CUmemGenericAllocationHandle dev = 0, host = 0;
  uintptr_t scratch = 0;
  uint64_t last_use = 0;
  uint32_t holds = 0;            // graphs, collectives, pins: not evicted while > 0
  Cause cause = Cause::kBudget;  // kEvicting: why
  uint64_t queued_ns = 0;        // kEvicting: when the copy was queued
  std::vector<Event> pending;    // freed: events on `users` that must complete first
};

namespace {

size_t round_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

// Small blocks are 512-byte aligned, like PyTorch's, in chunks of 2 MiB.
constexpr size_t kSmallAlign = 512;
constexpr size_t kChunk = 2ull << 20;

// A cached large block serves a request if it wastes little: at most a
// granule or an eighth of the request, whichever is more.
size_t slack(size_t cap, size_t granule) {
  return std::max(granule, cap / 8);
}

}  // namespace

std::unique_ptr<Allocator> Allocator::create(const cu::Driver& d, const AllocatorOptions& o,
                                             std::string* why) {
  InternalCalls internal;
  std::unique_ptr<Allocator> a(new Allocator(d, o));
  if (!a->ensure_context()) {
    *why = "no CUDA context for device " + std::to_string(o.device);
    return nullptr;
  }
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = o.device;
  size_t g = 0;
  CUresult r = d.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (r != CUDA_SUCCESS || g == 0) {
    *why = "cuMemGetAllocationGranularity failed: " + cu::describe(d, r);
    return nullptr;
  }
  a->granule_ = g;
  size_t total = 0;
  CUdevice dev = 0;
  d.cuDeviceGet(&dev, o.device);
  // Contract 4 for managed mode: without concurrent managed access the GPU
  // cannot be prefetched to while other work runs (and the host may not touch
  // managed memory while kernels run). Caching only, one warning, as below.
  int concurrent = 0;
  if (o.managed &&
      (d.cuDeviceGetAttribute(&concurrent, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, dev) !=
           CUDA_SUCCESS ||
       !concurrent)) {
    log::warn(
        "device {} has no concurrent managed access "
        "(CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS is 0): SPILLWAY_MODE=managed cannot "
        "evict; eviction and the budget are off, spillway only caches allocations",
        o.device);
    a->o_.managed = false;
    a->o_.evict = false;
    a->o_.gpu_budget = 0;
  }
  int host_vmm = 0;
  if (!o.managed && o.evict &&
      (d.cuDeviceGetAttribute(&host_vmm,
                              CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                              dev) != CUDA_SUCCESS ||
       !host_vmm)) {
    // Contract 4: no host memory to evict to, so no budget to keep: a budget
    // without eviction would fail allocations the job could make without
    // spillway. Caching only, as in SPILLWAY_MODE=off.
    log::warn(
        "device {} cannot map host memory into its address space "
        "(CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0): eviction "
        "and the budget are off, spillway only caches allocations",
        o.device);
    a->o_.evict = false;
    a->o_.gpu_budget = 0;
  }
  d.cuDeviceTotalMem(&total, dev);
  // VA is cheap: room for the device's memory four times over, so evicted
  // blocks (which keep their addresses) never exhaust it.
  r = a->arena_.reserve(std::max<size_t>(4 * total, 64ull << 30));
  if (r != CUDA_SUCCESS) {
    *why = "cuMemAddressReserve failed: " + cu::describe(d, r);
    return nullptr;
  }
  a->d2h_ = Stream(d, CU_STREAM_NON_BLOCKING);
  a->h2d_ = Stream(d, CU_STREAM_NON_BLOCKING);
  a->ev_ = Event(d);
  if (!a->d2h_ || !a->h2d_ || !a->ev_) {
    *why = "cannot create the copy streams or events";
    return nullptr;
  }
  a->bg_ev_ = Event(d);
  a->owners_.assign(a->arena_.size() / g, nullptr);
  a->s_.budget_bytes = a->o_.gpu_budget;
  a->s_.host_budget_bytes = o.host_budget;
  if (o.background && a->o_.evict && a->o_.gpu_budget > 4 * g) {
    a->high_water_ = a->o_.gpu_budget - std::max<uint64_t>(g, a->o_.gpu_budget / 20);
    a->bg_ = std::thread([p = a.get()] { p->background_loop(); });
  }
  return a;
}

Allocator::Allocator(const cu::Driver& d, const AllocatorOptions& o)
    : d_(d),
      o_(o),
      arena_(d, 2ull << 20),
      dev_(d,
           [&] {
             CUmemAllocationProp p{};
             p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
             p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
             p.location.id = o.device;
             return p;
           }()),
      host_(d,
            [&] {
              // Host memory on the GPU's own NUMA node (design.md 4.1), so
              // that copies do not cross sockets; plain HOST if it has none.
              CUmemAllocationProp p{};
              p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
              CUdevice dev = 0;
              int numa = -1;
              if (d.cuDeviceGet(&dev, o.device) != CUDA_SUCCESS ||
                  d.cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev) !=
                      CUDA_SUCCESS)
                numa = -1;
              p.location.type =
                  numa >= 0 ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_HOST;
              p.location.id = numa >= 0 ? numa : 0;
              return p;
            }()),
      chooser_(o.chooser ? o.chooser : std::make_shared<policy::ScheduleChooser>()) {}

void Allocator::stop_background() {
  if (!bg_.joinable()) return;
  {
    std::lock_guard lk(mu_);
    bg_stop_ = true;
  }
  bg_cv_.notify_one();
  bg_.join();
}

Allocator::~Allocator() {
  InternalCalls internal;
  stop_background();
  // Whatever is still queued in this allocator's context may use its memory:
  // it finishes first (the calling thread may have another device current).
  CUcontext popped = nullptr;
  const bool pushed = ctx_ && CU_CALL(d_, cuCtxPushCurrent, ctx_) == CUDA_SUCCESS;
  if (pushed) d_.cuCtxSynchronize();
  // Managed blocks are separate driver allocations.
  for (auto& [p, b] : managed_blocks_) CU_CALL(d_, cuMemFree, static_cast<CUdeviceptr>(p));
  // Every mapping in the arena goes, and its memory back to the pools, which
  // release it; then the arena's range can be freed.
  std::vector<const Block*> spare(spare_.begin(), spare_.end());
  std::sort(spare.begin(), spare.end());
  for (const auto& owned : blocks_) {
    const Block* b = owned.get();
    if (!b->large || o_.managed || std::binary_search(spare.begin(), spare.end(), b)) continue;
    CU_CALL(d_, cuMemUnmap, b->ptr, b->cap);
    if (b->scratch) CU_CALL(d_, cuMemUnmap, b->scratch, b->cap);
    if (b->dev) dev_.give(b->dev, b->cap);
    if (b->host) host_.give(b->host, b->cap);
  }
  for (auto& [va, c] : chunks_) {
    CU_CALL(d_, cuMemUnmap, c->va, c->size);
    dev_.give(c->handle, c->size);
  }
  if (pushed) CU_CALL(d_, cuCtxPopCurrent, &popped);
}

Allocator::Block* Allocator::owner_of(uintptr_t p) {
  if (arena_.contains(p)) {
    if (Block* b = owners_[(p - arena_.base()) / granule_]) return b;
  } else if (Block* b = managed_at(p)) {
    return b;
  }
  return find_live(p);  // small blocks: exact pointers only
}

Allocator::Block* Allocator::managed_at(uintptr_t p) const {
  auto it = managed_blocks_.upper_bound(p);
  if (it == managed_blocks_.begin()) return nullptr;
  --it;
  return p - it->first < it->second->cap ? it->second : nullptr;
}

void Allocator::set_owner(Block* b) {
  if (o_.managed) {
    managed_blocks_[b->ptr] = b;
    // Only ever widened: the tracker's cheap filter may pass a few addresses
    // that are no longer ours, never miss one that is.
    uintptr_t lo = managed_lo_.load(std::memory_order_relaxed);
    while (b->ptr < lo && !managed_lo_.compare_exchange_weak(lo, b->ptr)) {
    }
    uintptr_t hi = managed_hi_.load(std::memory_order_relaxed);
    while (b->ptr + b->cap > hi && !managed_hi_.compare_exchange_weak(hi, b->ptr + b->cap)) {
    }
    return;
  }
  const size_t first = (b->ptr - arena_.base()) / granule_;
  for (size_t i = 0; i < b->cap / granule_; ++i) owners_[first + i] = b;
}

void Allocator::forget_owner(Block* b) {
  if (o_.managed) {
    managed_blocks_.erase(b->ptr);
    return;
  }
  const size_t first = (b->ptr - arena_.base()) / granule_;
  for (size_t i = 0; i < b->cap / granule_; ++i) owners_[first + i] = nullptr;
}

bool Allocator::ensure_context() {
  // Allocation paths that reach the driver run on PyTorch's threads (which
  // have the primary context current) and on spillway's own.
  CUcontext cur = nullptr;
  if (d_.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur) {
    if (!ctx_) ctx_ = cur;
    return true;
  }
  if (!ctx_) {
    CUdevice dev = 0;
    if (CU_CALL(d_, cuDeviceGet, &dev, o_.device) != CUDA_SUCCESS) return false;
    if (CU_CALL(d_, cuDevicePrimaryCtxRetain, &ctx_, dev) != CUDA_SUCCESS) return false;
  }
  return CU_CALL(d_, cuCtxSetCurrent, ctx_) == CUDA_SUCCESS;
}

Allocator::Block* Allocator::new_block() {
  if (!spare_.empty()) {
    Block* b = spare_.back();
    spare_.pop_back();
    *b = Block{};
    return b;
  }
  blocks_.push_back(std::make_unique<Block>());
  return blocks_.back().get();
}

void Allocator::note_live(Block* b, size_t size, CUstream stream) {
  b->live = true;
  b->size = size;
  b->stream = stream;
  b->last_use = ++tick_;
  live_[b->ptr] = b;
  if (b->large) chooser_->on_alloc(b->ptr);
  s_.live_bytes += size;
  s_.peak_live_bytes = std::max(s_.peak_live_bytes, s_.live_bytes);
  ++s_.mallocs;
}

void* Allocator::malloc(size_t size, CUstream stream) {
  InternalCalls internal;
  if (size == 0) return nullptr;
  std::lock_guard lk(mu_);
  if (!pending_.empty()) process_pending();
  void* p = size < o_.min_block ? malloc_small(size, stream) : malloc_large(size, stream);
  if (!p) {
    ++s_.ooms;
    log_resident_set("allocation failed");
  }
  s_.resident_bytes = resident();
  s_.peak_resident_bytes = std::max(s_.peak_resident_bytes, s_.resident_bytes);
  notify_memory();
  if (high_water_ && s_.resident_bytes > high_water_) bg_cv_.notify_one();
  return p;
}

void* Allocator::malloc_small(size_t size, CUstream stream) {
  const size_t n = round_up(size, kSmallAlign);
  if (auto it = small_cache_.find({stream, n}); it != small_cache_.end() && !it->second.empty()) {
    Block* b = it->second.back();
    it->second.pop_back();
    ++s_.cache_hits;
    note_live(b, size, stream);
    return reinterpret_cast<void*>(b->ptr);
  }
  auto carve = [&]() -> uintptr_t {
    for (Chunk* c : stream_chunks_[stream])
      if (uintptr_t p = c->free.take(n)) return p;
    return 0;
  };
  uintptr_t p = carve();
  if (!p && !small_cache_.empty()) {
    flush_small_cache();  // coalesce what other sizes left behind first
    p = carve();
  }
  if (p) {
    ++s_.cache_hits;
  } else {
    Chunk* c = new_chunk(n, stream);
    if (!c) return nullptr;
    p = c->free.take(n);
  }
  Block* b = new_block();
  b->ptr = p;
  b->cap = n;
  note_live(b, size, stream);
  return reinterpret_cast<void*>(p);
}

void Allocator::flush_small_cache() {
  for (auto& [key, v] : small_cache_) {
    for (Block* b : v) {
      chunk_of(b->ptr)->free.give(b->ptr, b->cap);
      spare_.push_back(b);
    }
  }
  small_cache_.clear();
}

Allocator::Chunk* Allocator::new_chunk(size_t at_least, CUstream stream) {
  const size_t size = round_up(std::max(at_least, kChunk), granule_);
  CUmemGenericAllocationHandle h = 0;
  if (!ensure_context() || take_device(size, &h) != CUDA_SUCCESS) return nullptr;
  CUresult r = CUDA_SUCCESS;
  uintptr_t va = arena_.take(size);
  if (!va || (r = map_rw(d_, va, size, h, o_.device)) != CUDA_SUCCESS) {
    if (va) arena_.give(va, size);
    dev_.give(h, size);
    return nullptr;
  }
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
  return raw;
}

Allocator::Chunk* Allocator::chunk_of(uintptr_t p) {
  auto it = chunks_.upper_bound(p);
  if (it == chunks_.begin()) return nullptr;
  --it;
  return p < it->first + it->second->size ? it->second.get() : nullptr;
}

size_t Allocator::release_free_chunks(size_t want) {
  flush_small_cache();  // cached small blocks keep their chunks busy
  size_t freed = 0;
  for (auto& [stream, v] : stream_chunks_) {
    bool drained = false;
    for (auto it = v.begin(); it != v.end() && freed < want;) {
      Chunk* c = *it;
      if (c->free.free_bytes() != c->size) {
        ++it;
        continue;
      }
      if (!drained && drain(stream) != CUDA_SUCCESS) break;
      drained = true;
      if (CU_CALL(d_, cuMemUnmap, c->va, c->size) != CUDA_SUCCESS) {
        ++it;
        continue;
      }
      arena_.give(c->va, c->size);
      dev_.give(c->handle, c->size);
      freed += c->size;
      small_bytes_ -= c->size;
      it = v.erase(it);
      chunks_.erase(c->va);
    }
  }
  return freed;
}

void* Allocator::malloc_large(size_t size, CUstream stream) {
  const size_t cap = round_up(size, granule_);
  Block* b = take_cached(cap, stream);
  if (b) {
    ++s_.cache_hits;
  } else {
    if (!ensure_context()) return nullptr;
    b = new_large(cap, stream);
    if (!b) return nullptr;
  }
  note_live(b, size, stream);
  return reinterpret_cast<void*>(b->ptr);
}

Allocator::Block* Allocator::take_cached(size_t cap, CUstream stream) {
  const size_t limit = cap + slack(cap, granule_);
  auto take_from = [&](SizeLists& m) -> Block* {
    for (auto it = m.lower_bound(cap); it != m.end() && it->first <= limit; ++it) {
      if (it->second.empty()) continue;
      Block* b = it->second.back();
      it->second.pop_back();
      return b;
    }
    return nullptr;
  };
  if (auto it = cached_large_.find(stream); it != cached_large_.end())
    if (Block* b = take_from(it->second)) return b;
  // Another stream's free block: usable once this stream is ordered after all
  // the work the freeing stream had queued (contract 3).
  for (auto& [other, m] : cached_large_) {
    if (other == stream) continue;
    if (Block* b = take_from(m)) {
      if (order_after(stream, other) == CUDA_SUCCESS) return b;
      m[b->cap].push_back(b);  // could not order: leave it where it was
    }
  }
  return nullptr;
}

CUresult Allocator::take_device(size_t size, CUmemGenericAllocationHandle* h) {
  if (!make_room(size)) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult r = dev_.take(size, h);
  // The device may be fuller than the budget says (other processes, other
  // libraries): make more room and retry while there is anything to free.
  size_t freed = 0;
  const bool short_of_device = r == CUDA_ERROR_OUT_OF_MEMORY;
  while (r == CUDA_ERROR_OUT_OF_MEMORY) {
    size_t got = dev_.trim(size);
    if (got == 0) {
      got = release_cached(size);
      if (got == 0 && o_.evict) got = evict_for(size, Cause::kPressure);
      if (got == 0) break;
      dev_.trim(size, size);
    }
    freed += got;
    r = dev_.take(size, h);
  }
  if (short_of_device && r == CUDA_SUCCESS && o_.observer)
    o_.observer->on_oom_avoided(o_.device, size, freed);
  if (r != CUDA_SUCCESS)
    log::warn("cuMemCreate({} bytes, device {}) failed: {}", size, o_.device, cu::describe(d_, r));
  s_.device_creates = dev_.creates();
  return r;
}

bool Allocator::take_managed(size_t size) {
  if (!make_room(size)) return false;
  // Nothing to create here: the pages come with the prefetch that follows. A
  // device fuller than the budget says is the driver's to handle (it
  // migrates managed pages out itself): slow, correct.
  managed_dev_ += size;
  return true;
}

Allocator::Block* Allocator::new_managed(size_t cap, CUstream stream) {
  if (!take_managed(cap)) return nullptr;
  CUdeviceptr p = 0;
  if (CUresult r = CU_CALL(d_, cuMemAllocManaged, &p, cap, CU_MEM_ATTACH_GLOBAL);
      r != CUDA_SUCCESS) {
    managed_dev_ -= cap;
    log::error("cuMemAllocManaged of {} bytes on device {} failed: {}", cap, o_.device,
               cu::describe(d_, r));
    return nullptr;
  }
  // Placed on the device on the allocating stream: its first use there does
  // not fault, and no one waits. A capturing stream would record the prefetch
  // into its graph: the copy stream does it then, and the host waits.
  const bool capturing = not_capturing(stream) != CUDA_SUCCESS;
  CUresult r = prefetch(p, cap, true, capturing ? h2d_.get() : stream);
  if (r == CUDA_SUCCESS && capturing) r = drain(h2d_.get());
  // Not a reason to fail the allocation (contract 4): untouched managed pages
  // are populated where the GPU first touches them, at the cost of faults.
  if (r != CUDA_SUCCESS)
    log::warn(
        "placing {} managed bytes at {:#x} on device {} failed ({}): its first use faults "
        "them in",
        cap, p, o_.device, cu::describe(d_, r));
  Block* b = new_block();
  b->ptr = p;
  b->cap = cap;
  b->large = true;
  b->stream = stream;
  set_owner(b);
  return b;
}

CUresult Allocator::free_managed(Block* b) {
  // cuMemFree gives back the device pages (and any host ones) without moving
  // a byte: the cheapest way to release a managed block, cheaper than a
  // prefetch of its garbage to the host. It waits for work still using the
  // block, which the callers have already drained.
  CUresult r = CU_CALL(d_, cuMemFree, static_cast<CUdeviceptr>(b->ptr));
  if (r != CUDA_SUCCESS) return r;
  forget_owner(b);
  return CUDA_SUCCESS;
}

Allocator::Block* Allocator::new_large(size_t cap, CUstream stream) {
  if (o_.managed) return new_managed(cap, stream);
  CUmemGenericAllocationHandle h = 0;
  if (take_device(cap, &h) != CUDA_SUCCESS) return nullptr;
  uintptr_t va = arena_.take(cap);
  if (!va) {
    log::error("the VA arena ({} bytes) is exhausted", arena_.size());
    dev_.give(h, cap);
    return nullptr;
  }
  if (CUresult r = map_rw(d_, va, cap, h, o_.device); r != CUDA_SUCCESS) {
    log::error("mapping {} bytes at {:#x} failed: {}", cap, va, cu::describe(d_, r));
    arena_.give(va, cap);
    dev_.give(h, cap);
    return nullptr;
  }
  Block* b = new_block();
  b->ptr = va;
  b->cap = cap;
  b->large = true;
  b->dev = h;
  b->stream = stream;
  set_owner(b);
  s_.device_creates = dev_.creates();
  return b;
}

CUresult Allocator::prefetch(uintptr_t p, size_t n, bool to_device, CUstream s) {
  CUmemLocation loc{};
  loc.type = to_device ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST;
  loc.id = to_device ? o_.device : 0;
  return CU_CALL(d_, cuMemPrefetchAsync, static_cast<CUdeviceptr>(p), n, loc, 0u, s);
}

void Allocator::give_device(CUmemGenericAllocationHandle h, size_t size) {
  if (o_.managed)
    managed_dev_ -= size;
  else
    dev_.give(h, size);
}

Allocator::Block* Allocator::find_live(uintptr_t p) {
  auto it = live_.find(p);
  return it == live_.end() ? nullptr : it->second;
}

void Allocator::free(void* ptr, size_t size, CUstream stream) {
  InternalCalls internal;
  if (!ptr) return;
  std::lock_guard lk(mu_);
  Block* b = find_live(reinterpret_cast<uintptr_t>(ptr));
  if (!b) {
    ++s_.bad_frees;
    log::error(
        "free of {} ({} bytes, stream {}): not a live spillway allocation (double free "
        "or unknown pointer); ignored",
        ptr, size, static_cast<void*>(stream));
    return;
  }
  if (size != b->size) {
    ++s_.bad_frees;
    log::error("free of {} with size {}, but it was allocated with {} bytes; ignored", ptr, size,
               b->size);
    return;
  }
  live_.erase(b->ptr);
  if (b->large) chooser_->on_free(b->ptr);
  b->live = false;
  b->holds = 0;
  s_.live_bytes -= b->size;
  ++s_.frees;
  b->last_use = ++tick_;
  if (b->where == Block::Where::kHost) {
    free_evicted(b);
    return;
  }
  if (b->where == Block::Where::kEvicting) {
    // Its device copy stays; it is reusable only once the eviction copy
    // (which reads it) is done, so that a new owner's writes do not race it.
    b->cancel = true;
    Event e = take_event();
    if (CU_CALL(d_, cuEventRecord, e.get(), d2h_.get()) == CUDA_SUCCESS)
      b->pending.push_back(std::move(e));
  }
  // Streams other than the allocation stream that used the block may still
  // have work on it queued: it becomes reusable when events recorded on each
  // of them now have completed (PyTorch's record_stream, done for the user).
  for (CUstream u : b->users) {
    Event e = take_event();
    if (CU_CALL(d_, cuEventRecord, e.get(), u) == CUDA_SUCCESS) b->pending.push_back(std::move(e));
  }
  b->users.clear();
  if (!b->pending.empty()) {
    pending_.push_back(b);
    return;
  }
  make_reusable(b);
}

void Allocator::make_reusable(Block* b) {
  // The block returns to its allocation stream, whatever stream freed it:
  // that is the stream its last uses are ordered on.
  if (b->large) {
    cached_large_[b->stream][b->cap].push_back(b);
  } else {
    small_cache_[{b->stream, b->cap}].push_back(b);
  }
}

void Allocator::process_pending() {
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

Event Allocator::take_event() {
  if (events_.empty()) return Event(d_);
  Event e = std::move(events_.back());
  events_.pop_back();
  return e;
}

void Allocator::free_evicted(Block* b) {
  // Queued work may still read the host copy: let it finish before unmapping.
  drain(b->stream);
  for (CUstream u : b->users) drain(u);
  if (o_.managed) {
    if (free_managed(b) != CUDA_SUCCESS) {
      log::error("freeing evicted managed block {:#x} failed; its memory is kept", b->ptr);
      return;
    }
    managed_host_ -= b->cap;
    spare_.push_back(b);
    return;
  }
  if (CU_CALL(d_, cuMemUnmap, b->ptr, b->cap) != CUDA_SUCCESS) {
    log::error("unmapping evicted block {:#x} failed; its host memory is kept", b->ptr);
    return;
  }
  host_.give(b->host, b->cap);
  arena_.give(b->ptr, b->cap);
  forget_owner(b);
  spare_.push_back(b);
}

size_t Allocator::excess(size_t need) const {
  // Taking a pooled handle of exactly `need` bytes adds nothing to what is held.
  // (In managed mode the request may be a managed block, which no pooled
  // handle serves: counted in full, a little early for a small chunk.)
  const uint64_t want = o_.managed ? resident() + need : dev_.held() + (dev_.has(need) ? 0 : need);
  return want > o_.gpu_budget ? want - o_.gpu_budget : 0;
}

bool Allocator::make_room(size_t need) {
  if (o_.gpu_budget == 0 || excess(need) == 0) return true;
  // Cheapest first: pooled handles, then cached free blocks, then live blocks.
  // Freed handles go to the pool; only the excess is released, and a handle
  // of the size about to be taken is kept for it.
  dev_.trim(excess(need), need);
  if (excess(need) > 0) release_cached(excess(need));
  dev_.trim(excess(need), need);
  if (excess(need) > 0 && o_.evict) {
    over_budget_seen_ = true;
    evict_for(excess(need), Cause::kBudget);
  }
  dev_.trim(excess(need), need);
  s_.device_creates = dev_.creates();
  if (size_t short_by = excess(need)) {
    log::warn("cannot fit {} bytes in the budget of {} bytes: {} bytes short", need, o_.gpu_budget,
              short_by);
    return false;
  }
  return true;
}

size_t Allocator::release_cached(size_t want) {
  // Each stream is drained once (its queued work may still use the blocks),
  // then free blocks and wholly free small chunks are unmapped.
  size_t freed = release_free_chunks(want);
  for (auto& [stream, m] : cached_large_) {
    if (freed >= want) break;
    bool any = false;
    for (auto& [cap, v] : m) any = any || !v.empty();
    if (!any || drain(stream) != CUDA_SUCCESS) continue;
    for (auto& [cap, v] : m) {
      for (size_t i = 0; i < v.size() && freed < want;) {
        Block* b = v[i];
        // A block whose eviction was cancelled is referenced by that batch
        // until it finishes.
        if (b->where != Block::Where::kDevice) {
          ++i;
          continue;
        }
        if (o_.managed) {
          if (free_managed(b) != CUDA_SUCCESS) {
            ++i;
            continue;
          }
          managed_dev_ -= b->cap;
        } else {
          if (CU_CALL(d_, cuMemUnmap, b->ptr, b->cap) != CUDA_SUCCESS) {
            ++i;
            continue;
          }
          arena_.give(b->ptr, b->cap);
          dev_.give(b->dev, b->cap);
          forget_owner(b);
        }
        freed += b->cap;
        ++s_.cached_releases;
        spare_.push_back(b);
        v[i] = v.back();
        v.pop_back();
      }
    }
  }
  return freed;
}

std::vector<Allocator::Block*> Allocator::choose_victims(size_t want) {
  std::vector<policy::Candidate> cands;
  for (auto& [p, b] : live_)
    if (b->large && b->where == Block::Where::kDevice && b->holds == 0)
      cands.push_back({p, b->cap, b->last_use});
  std::vector<Block*> victims;
  for (uint64_t id : chooser_->choose(std::move(cands), want)) victims.push_back(live_.at(id));
  return victims;
}

size_t Allocator::evict_for(size_t want, Cause cause) {
  return evict_blocks(choose_victims(want), cause);
}

// An event recorded on a capturing stream would become part of the graph
// (and a wait on it would join the waiter into the capture): spillway does
// not order its own work after a stream while it captures.
CUresult Allocator::not_capturing(CUstream s) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = d_.cuStreamIsCapturing(s, &status);
  if (r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE)
    r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return r;
}

CUresult Allocator::order_after(CUstream waiter, CUstream s) {
  if (CUresult c = not_capturing(s); c != CUDA_SUCCESS) return c;
  CUresult r = CU_CALL(d_, cuEventRecord, ev_.get(), s);
  if (r == CUDA_SUCCESS) r = CU_CALL(d_, cuStreamWaitEvent, waiter, ev_.get(), 0);
  return r;
}

CUresult Allocator::order_after_users(CUstream waiter, const Block* b) {
  CUresult r = order_after(waiter, b->stream);
  for (CUstream u : b->users)
    if (r == CUDA_SUCCESS) r = order_after(waiter, u);
  return r;
}

CUresult Allocator::drain(CUstream s) {
  if (CUresult c = not_capturing(s); c != CUDA_SUCCESS) return c;
  CUresult r = CU_CALL(d_, cuEventRecord, ev_.get(), s);
  if (r == CUDA_SUCCESS) r = CU_CALL(d_, cuEventSynchronize, ev_.get());
  return r;
}

size_t Allocator::evict_blocks(const std::vector<Block*>& victims, Cause cause) {
  std::vector<Block*> started = start_evictions(victims, cause);
  if (started.empty()) return 0;
  // Contract 1: the copies complete before device memory is released.
  const bool copied = drain(d2h_.get()) == CUDA_SUCCESS;
  return finish_evictions(started, copied);
}

std::vector<Allocator::Block*> Allocator::start_evictions(const std::vector<Block*>& victims,
                                                          Cause cause) {
  std::vector<Block*> started;
  // Copy each block into host memory mapped at a scratch address, on the D2H
  // stream, after everything already queued on the streams that use it.
  for (Block* b : victims) {
    if (b->holds > 0) continue;
    if (o_.managed) {
      if (!start_managed_eviction(b)) break;
    } else if (!start_host_eviction(b)) {
      break;
    }
    if (b->where != Block::Where::kEvicting) continue;  // its copy failed: the next one
    b->cause = cause;
    b->queued_ns = o_.observer ? monotonic_ns() : 0;
    b->cancel = false;
    started.push_back(b);
  }
  s_.host_bytes = host_held();
  s_.peak_host_bytes = std::max(s_.peak_host_bytes, s_.host_bytes);
  s_.host_creates = host_.creates();
  return started;
}

bool Allocator::start_managed_eviction(Block* b) {
  if (o_.host_budget && managed_host_ + b->cap > o_.host_budget) {
    log::warn("host budget of {} bytes reached: block {:#x} ({} bytes) stays on the device",
              o_.host_budget, b->ptr, b->cap);
    return false;
  }
  // After everything already queued on the streams that use it, so no queued
  // kernel faults its pages straight back.
  CUresult r = order_after_users(d2h_.get(), b);
  if (r == CUDA_SUCCESS) r = prefetch(b->ptr, b->cap, false, d2h_.get());
  if (r != CUDA_SUCCESS) {
    log::warn("eviction prefetch of {:#x} failed: {}", b->ptr, cu::describe(d_, r));
    ++s_.evictions_failed;
    return true;
  }
  managed_host_ += b->cap;
  b->where = Block::Where::kEvicting;
  return true;
}

bool Allocator::start_host_eviction(Block* b) {
  // Host memory counts against its budget whether in use or pooled.
  if (o_.host_budget && !host_.has(b->cap)) {
    const size_t want = host_.held() + b->cap;
    if (want > o_.host_budget) host_.trim(want - o_.host_budget);
    if (host_.held() + b->cap > o_.host_budget) {
      log::warn("host budget of {} bytes reached: block {:#x} ({} bytes) stays on the device",
                o_.host_budget, b->ptr, b->cap);
      return false;
    }
  }
  CUmemGenericAllocationHandle h = 0;
  CUresult r = host_.take(b->cap, &h);
  if (r != CUDA_SUCCESS) {
    log::warn("host memory for eviction ({} bytes) unavailable: {}", b->cap, cu::describe(d_, r));
    ++s_.evictions_failed;
    return false;
  }
  uintptr_t scratch = arena_.take(b->cap);
  if (!scratch || map_rw(d_, scratch, b->cap, h, o_.device) != CUDA_SUCCESS) {
    if (scratch) arena_.give(scratch, b->cap);
    host_.give(h, b->cap);
    ++s_.evictions_failed;
    return false;
  }
  if ((r = order_after_users(d2h_.get(), b)) != CUDA_SUCCESS ||
      (r = CU_CALL(d_, cuMemcpyDtoDAsync, scratch, b->ptr, b->size, d2h_.get())) != CUDA_SUCCESS) {
    log::warn("eviction copy of {:#x} failed: {}", b->ptr, cu::describe(d_, r));
    CU_CALL(d_, cuMemUnmap, scratch, b->cap);
    arena_.give(scratch, b->cap);
    host_.give(h, b->cap);
    ++s_.evictions_failed;
    return true;
  }
  b->where = Block::Where::kEvicting;
  b->host = h;
  b->scratch = scratch;
  return true;
}

size_t Allocator::finish_evictions(const std::vector<Block*>& started, bool copied) {
  // Swap each block's address to its host copy, unless the eviction was
  // cancelled (used or freed meanwhile) or a step fails: then the device
  // memory, still mapped and intact, stays.
  size_t freed = 0;
  for (Block* b : started) {
    bool swapped = false;
    if (o_.managed) {
      // The prefetch has moved the pages; nothing to swap.
      swapped = copied && !b->cancel;
      if (!swapped) {
        // Cancelled (or not known to be done): the block counts as resident,
        // so its pages go back, on d2h behind the eviction's prefetch.
        // Meanwhile a GPU access faults them in: slow, correct.
        managed_host_ -= b->cap;
        prefetch(b->ptr, b->cap, true, d2h_.get());
      }
    } else {
      const bool scratch_unmapped = CU_CALL(d_, cuMemUnmap, b->scratch, b->cap) == CUDA_SUCCESS;
      if (copied && scratch_unmapped && !b->cancel &&
          CU_CALL(d_, cuMemUnmap, b->ptr, b->cap) == CUDA_SUCCESS) {
        swapped = map_rw(d_, b->ptr, b->cap, b->host, o_.device) == CUDA_SUCCESS;
        if (!swapped) map_rw(d_, b->ptr, b->cap, b->dev, o_.device);  // put the device memory back
      }
      if (scratch_unmapped) arena_.give(b->scratch, b->cap);  // else leak VA rather than alias it
      b->scratch = 0;
    }
    if (swapped) {
      give_device(b->dev, b->cap);
      freed += b->cap;
      b->dev = 0;
      b->where = Block::Where::kHost;
      ++s_.blocks_evicted;
      s_.bytes_evicted += b->size;
      if (o_.observer)
        o_.observer->on_transfer(
            {true, b->cause, o_.device, b->ptr, b->size, d2h_.get(), b->queued_ns, monotonic_ns()});
    } else {
      if (!o_.managed) host_.give(b->host, b->cap);
      b->host = 0;
      b->where = Block::Where::kDevice;
      if (b->cancel) {
        ++s_.evictions_cancelled;
      } else {
        ++s_.evictions_failed;
        log::warn("eviction of {:#x} rolled back (pending work on it, or a driver error)", b->ptr);
      }
    }
    b->cancel = false;
  }
  return freed;
}

CUresult Allocator::evict(const void* ptr) {
  InternalCalls internal;
  std::lock_guard lk(mu_);
  Block* b = find_live(reinterpret_cast<uintptr_t>(ptr));
  if (!b || !b->large) return CUDA_ERROR_INVALID_VALUE;
  if (b->where == Block::Where::kHost) return CUDA_SUCCESS;
  if (b->where == Block::Where::kEvicting) return CUDA_ERROR_NOT_READY;
  if (!ensure_context()) return CUDA_ERROR_INVALID_CONTEXT;
  evict_blocks({b}, Cause::kBudget);
  s_.resident_bytes = resident();
  notify_memory();
  return b->where == Block::Where::kHost ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult Allocator::restore(const void* ptr, CUstream stream) {
  InternalCalls internal;
  std::lock_guard lk(mu_);
  Block* b = owner_of(reinterpret_cast<uintptr_t>(ptr));
  if (!b || !b->live) return CUDA_ERROR_INVALID_VALUE;
  note_user(b, stream);
  b->last_use = ++tick_;
  if (b->where == Block::Where::kEvicting) {
    cancel_eviction(b, &stream);
    return CUDA_SUCCESS;
  }
  if (b->where == Block::Where::kDevice) return CUDA_SUCCESS;
  if (!ensure_context()) return CUDA_ERROR_INVALID_CONTEXT;
  CUresult r = restore_block(b, Cause::kOnDemand, &stream);
  s_.resident_bytes = resident();
  s_.peak_resident_bytes = std::max(s_.peak_resident_bytes, s_.resident_bytes);
  notify_memory();
  return r;
}

void Allocator::note_use(const void* ptr, CUstream stream) {
  std::lock_guard lk(mu_);
  Block* b = owner_of(reinterpret_cast<uintptr_t>(ptr));
  if (b && b->live) note_user(b, stream);
}

void Allocator::before_use(const Access& a, const Touch* touches, size_t n) {
  InternalCalls internal;
  const CUstream stream = a.stream;
  std::lock_guard lk(mu_);
  bool moved = false;
  // The launch's blocks are claimed (held) as they come: restoring one must
  // not evict another the same launch needs, whatever the policy predicts.
  claimed_.clear();
  auto use = [&](Block* b) {
    ++b->holds;
    claimed_.push_back(b);
    note_user(b, stream);
    b->last_use = ++tick_;
    chooser_->on_access({b->ptr, b->size, reinterpret_cast<uint64_t>(stream), a.seq, a.name});
    if (b->where == Block::Where::kEvicting) {
      cancel_eviction(b, &stream);
    } else if (b->where == Block::Where::kHost) {
      // Contract 1: restored before the work is queued (the caller is about
      // to queue it). On failure the host copy stays mapped: slow, correct.
      if (!ensure_context() || restore_block(b, Cause::kOnDemand, &stream) != CUDA_SUCCESS)
        log::warn("on-demand restore of {:#x} failed: it is used from host memory", b->ptr);
      s_.resident_bytes = resident();
      s_.peak_resident_bytes = std::max(s_.peak_resident_bytes, s_.resident_bytes);
      moved = true;
    }
  };
  for_each_block(touches, n, use, [&](Block* b) { note_user(b, stream); });
  for (Block* b : claimed_) --b->holds;
  if (moved) notify_memory();
}

template <class Large, class Small>
void Allocator::for_each_block(const Touch* touches, size_t n, Large&& large, Small&& small) {
  for (size_t i = 0; i < n; ++i) {
    const Touch& t = touches[i];
    if (o_.managed && !arena_.contains(t.lo)) {
      // Managed blocks: every one the range overlaps.
      auto it = managed_blocks_.upper_bound(t.lo);
      if (it != managed_blocks_.begin()) --it;
      for (; it != managed_blocks_.end() && it->first < t.hi; ++it)
        if (it->first + it->second->cap > t.lo && it->second->live) large(it->second);
      continue;
    }
    if (!arena_.contains(t.lo)) continue;
    // Large blocks: every block any granule of the range belongs to.
    const size_t first = (t.lo - arena_.base()) / granule_;
    const size_t last =
        (std::min<uintptr_t>(t.hi, arena_.base() + arena_.size()) - 1 - arena_.base()) / granule_;
    bool any = false;
    for (size_t g = first; g <= last; ++g) {
      Block* b = owners_[g];
      if (!b) continue;
      any = true;
      if (b->live) large(b);
      g = (b->ptr + b->cap - arena_.base()) / granule_ - 1;  // skip to its end
    }
    // Small blocks: known by their start address only.
    if (!any)
      if (Block* b = find_live(t.lo)) small(b);
  }
}

void Allocator::hold(const Touch* touches, size_t n) {
  InternalCalls internal;
  std::lock_guard lk(mu_);
  bool moved = false;
  for_each_block(
      touches, n,
      [&](Block* b) {
        ++b->holds;
        if (b->where == Block::Where::kEvicting) cancel_eviction(b, nullptr);
        if (b->where == Block::Where::kHost) {
          if (!ensure_context() || restore_block(b, Cause::kOnDemand, nullptr) != CUDA_SUCCESS)
            log::warn("restore of held block {:#x} failed: it is used from host memory", b->ptr);
          s_.resident_bytes = resident();
          s_.peak_resident_bytes = std::max(s_.peak_resident_bytes, s_.resident_bytes);
          moved = true;
        }
      },
      [](Block*) {});  // small blocks are never evicted
  if (moved) notify_memory();
}

void Allocator::release(const Touch* touches, size_t n) {
  std::lock_guard lk(mu_);
  for_each_block(
      touches, n, [](Block* b) { b->holds -= b->holds > 0 ? 1 : 0; }, [](Block*) {});
}

void Allocator::mark_step(uint64_t end) {
  std::lock_guard lk(mu_);
  chooser_->on_step(end);
}

void Allocator::notify_memory() {
  if (o_.observer) o_.observer->on_memory(o_.device, resident(), host_held(), o_.gpu_budget);
}

Allocator::Residency Allocator::residency(const void* ptr) {
  std::lock_guard lk(mu_);
  Block* b = owner_of(reinterpret_cast<uintptr_t>(ptr));
  if (!b || !b->live) return Residency::kUnknown;
  switch (b->where) {
    case Block::Where::kDevice:
      return Residency::kDevice;
    case Block::Where::kEvicting:
      return Residency::kEvicting;
    case Block::Where::kHost:
      return Residency::kHost;
  }
  return Residency::kUnknown;
}

void Allocator::note_user(Block* b, CUstream stream) {
  if (stream == b->stream) return;
  if (std::find(b->users.begin(), b->users.end(), stream) == b->users.end())
    b->users.push_back(stream);
}

void Allocator::cancel_eviction(Block* b, const CUstream* consumer) {
  // Host mode: its device memory is still mapped and current, keep it.
  b->cancel = true;
  if (!o_.managed || !consumer) return;
  // Managed mode: the prefetch may be moving its pages out right now. The
  // consumer waits for it and brings them back first rather than faulting
  // them back (finish_evictions would bring them back too, later).
  if (order_after(*consumer, d2h_.get()) != CUDA_SUCCESS ||
      not_capturing(*consumer) != CUDA_SUCCESS)
    return;
  prefetch(b->ptr, b->cap, true, *consumer);
}

CUresult Allocator::restore_block(Block* b, Cause cause, const CUstream* consumer) {
  const uint64_t queued = o_.observer ? monotonic_ns() : 0;
  if (o_.managed)
    return take_managed(b->cap) ? restore_managed(b, cause, consumer, queued)
                                : CUDA_ERROR_OUT_OF_MEMORY;
  CUmemGenericAllocationHandle h = 0;
  CUresult r = take_device(b->cap, &h);
  if (r != CUDA_SUCCESS) return r;
  uintptr_t scratch = arena_.take(b->cap);
  if (!scratch || (r = map_rw(d_, scratch, b->cap, h, o_.device)) != CUDA_SUCCESS) {
    if (scratch) arena_.give(scratch, b->cap);
    dev_.give(h, b->cap);
    return scratch ? r : CUDA_ERROR_OUT_OF_MEMORY;
  }
  // The host copy may have been written through its mapping by work queued
  // on any stream that uses the block: copy after all of it.
  if ((r = order_after_users(h2d_.get(), b)) == CUDA_SUCCESS &&
      (r = CU_CALL(d_, cuMemcpyDtoDAsync, scratch, b->ptr, b->size, h2d_.get())) == CUDA_SUCCESS)
    r = drain(h2d_.get());
  bool ok = r == CUDA_SUCCESS && CU_CALL(d_, cuMemUnmap, scratch, b->cap) == CUDA_SUCCESS;
  bool unmapped = ok && CU_CALL(d_, cuMemUnmap, b->ptr, b->cap) == CUDA_SUCCESS;
  if (unmapped && (r = map_rw(d_, b->ptr, b->cap, h, o_.device)) == CUDA_SUCCESS) {
    arena_.give(scratch, b->cap);
    host_.give(b->host, b->cap);
    b->host = 0;
    b->dev = h;
    note_restored(b, cause, queued);
    return CUDA_SUCCESS;
  }
  // Roll back: the host copy stays mapped at the block's address.
  if (unmapped) map_rw(d_, b->ptr, b->cap, b->host, o_.device);
  if (!ok) CU_CALL(d_, cuMemUnmap, scratch, b->cap);
  arena_.give(scratch, b->cap);
  dev_.give(h, b->cap);
  log::warn("restore of {:#x} failed: {}", b->ptr, cu::describe(d_, r));
  return r == CUDA_SUCCESS ? CUDA_ERROR_NOT_PERMITTED : r;
}

CUresult Allocator::restore_managed(Block* b, Cause cause, const CUstream* consumer,
                                    uint64_t queued) {
  // After the work queued on the block's streams, which may still touch its
  // host pages, so the migration does not race it. The consumer waits for the
  // prefetch in stream order: unlike a remap, nothing here needs the host to
  // wait, except for a holder with no stream (or a capturing consumer).
  CUresult r = order_after_users(h2d_.get(), b);
  if (r == CUDA_SUCCESS) r = prefetch(b->ptr, b->cap, true, h2d_.get());
  if (r == CUDA_SUCCESS && (!consumer || not_capturing(*consumer) != CUDA_SUCCESS ||
                            order_after(*consumer, h2d_.get()) != CUDA_SUCCESS))
    r = drain(h2d_.get());
  if (r != CUDA_SUCCESS) {
    // Still counted on the host; a GPU access faults its pages in.
    give_device(0, b->cap);
    log::warn("restore of {:#x} failed: {}", b->ptr, cu::describe(d_, r));
    return r;
  }
  managed_host_ -= b->cap;
  // done_ns is when the consumer was ordered after the prefetch, not when
  // the prefetch finished (nothing waits for that on the host).
  note_restored(b, cause, queued);
  return CUDA_SUCCESS;
}

void Allocator::note_restored(Block* b, Cause cause, uint64_t queued) {
  b->where = Block::Where::kDevice;
  ++s_.blocks_restored;
  s_.bytes_restored += b->size;
  if (o_.observer)
    o_.observer->on_transfer(
        {false, cause, o_.device, b->ptr, b->size, h2d_.get(), queued, monotonic_ns()});
}

void Allocator::background_loop() {
  InternalCalls internal;
  // The high/low watermarks keep a little headroom free ahead of need, so
  // that allocations rarely wait for an eviction copy themselves.
  const uint64_t high = o_.gpu_budget - std::max<uint64_t>(granule_, o_.gpu_budget / 20);
  const uint64_t low = o_.gpu_budget - std::max<uint64_t>(2 * granule_, o_.gpu_budget / 10);
  bool have_context = false;
  std::unique_lock lk(mu_);
  while (!bg_stop_) {
    bg_cv_.wait_for(lk, std::chrono::milliseconds(5));
    if (bg_stop_) break;
    if (!have_context) have_context = ensure_context();
    if (!have_context) continue;
    process_pending();
    if (resident() <= high || !over_budget_seen_) continue;
    // Cheapest first, as make_room: pooled handles, cached free blocks, and
    // only then live blocks.
    dev_.trim(resident() - low);
    if (resident() > high) release_cached(resident() - low);
    dev_.trim(resident() - low);
    if (resident() <= high) continue;
    std::vector<Block*> started = start_evictions(choose_victims(resident() - low), Cause::kBudget);
    if (started.empty()) continue;
    bool copied = CU_CALL(d_, cuEventRecord, bg_ev_.get(), d2h_.get()) == CUDA_SUCCESS;
    lk.unlock();  // the copies run without the lock: allocations go on
    copied = copied && CU_CALL(d_, cuEventSynchronize, bg_ev_.get()) == CUDA_SUCCESS;
    if (o_.before_swap) o_.before_swap();
    lk.lock();
    finish_evictions(started, copied);
    if (resident() > low) dev_.trim(resident() - low);
    s_.resident_bytes = resident();
    notify_memory();
    ++s_.background_batches;
  }
}

Stats Allocator::stats() {
  std::lock_guard lk(mu_);
  s_.resident_bytes = resident();
  // Everything behind live and cached blocks, on either side: fragmentation
  // is what of it no live byte uses.
  s_.reserved_bytes = (dev_.held() - dev_.pooled()) + (host_.held() - host_.pooled()) +
                      managed_dev_ + managed_host_;
  s_.small_pool_bytes = small_bytes_;
  s_.host_bytes = host_held();
  s_.device_creates = dev_.creates();
  s_.host_creates = host_.creates();
  return s_;
}

void Allocator::log_resident_set(const char* why) {
  std::vector<Block*> res;
  size_t evicted = 0;
  for (auto& [p, b] : live_) {
    if (b->large && b->where != Block::Where::kHost) res.push_back(b);
    if (b->where == Block::Where::kHost) evicted += b->cap;
  }
  std::sort(res.begin(), res.end(), [](Block* a, Block* b) { return a->cap > b->cap; });
  log::error(
      "{}: resident {} bytes of budget {}, {} live blocks ({} bytes live, {} evicted to "
      "host), host {} of {} bytes, small pool {} bytes",
      why, resident(), o_.gpu_budget, live_.size(), s_.live_bytes, evicted, host_held(),
      o_.host_budget, small_bytes_);
  for (size_t i = 0; i < res.size() && i < 10; ++i)
    log::error("  resident block {:#x}: {} bytes, stream {}", res[i]->ptr, res[i]->cap,
               static_cast<void*>(res[i]->stream));
}

}  // namespace spillway
