#include "allocator.h"

#include <algorithm>
#include <limits>

#include "log.h"
#include "schedule.h"
#include "size.h"

namespace spillway {

namespace {

size_t round_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

// Small blocks are 512-byte aligned, like PyTorch's, in chunks of 2 MiB.
constexpr size_t kSmallAlign = 512;
constexpr size_t kChunk = 2ull << 20;
// Above any granularity a device reports (2 MiB on current GPUs).
constexpr size_t kMaxGranule = 1ull << 30;

// A cached large block serves a request if it wastes little: at most a
// granule or an eighth of the request, whichever is more.
size_t slack(size_t cap, size_t granule) {
  return std::max(granule, cap / 8);
}

// Without one of those, a larger cached block still beats a new one, whose
// making costs create, map and set access now and unmap and release later
// (about 45 us each on an H100, docs/gpu.md), since no block is split:
// - under the budget's pressure, any larger one: it holds no more device
//   memory than is held now, where a new one would first release cached
//   blocks (lengths that change every step made a 16 GiB budget over a 13
//   GiB live peak take 2.4x the unconstrained time, all of it that churn),
//   but not while a step plan runs: its moves assume each block's own size
//   (a Llama-7B step at 60% took 10-15% longer);
// - with no budget, one up to twice the request, so that the memory held
//   stays near what PyTorch's allocator holds (which splits its blocks).
size_t wider_slack(size_t cap, bool pressed) {
  return pressed ? SIZE_MAX - cap : cap;
}

CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  return p;
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
  const CUmemAllocationProp prop = device_prop(o.device);
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
  d.cuDeviceTotalMem(&total, dev);
  // VA is cheap: room for the device's memory five times over, so evicted
  // blocks (which keep their addresses) never exhaust it and each device
  // handle may also be mapped at a staging address of its own (vmm.h), and
  // for twice the host memory spillway may hold: each host handle is staged
  // too. Where the process cannot have that
  // much, less, down to the first part: host memory that then finds no
  // staging range is refused like any host memory (the block stays).
  const uint64_t host = o.host_budget ? o.host_budget : 4 * uint64_t{total};
  const uint64_t floor = std::max<uint64_t>(5 * uint64_t{total}, 64ull << 30);
  r = a->arena_.reserve(floor + 2 * host, floor);
  if (r != CUDA_SUCCESS) {
    *why = "cuMemAddressReserve failed: " + cu::describe(d, r);
    return nullptr;
  }
  a->table_.init(a->arena_, g);
  a->streams_ = std::make_unique<CopyStreams>(d);
  if (!*a->streams_) {
    *why = "cannot create the copy streams or events";
    return nullptr;
  }
  const BackingParts parts{d, o.device, a->arena_, a->dev_, *a->streams_, a->table_, *a};
  a->backing_ = make_backing(parts, o.managed, o.evict);
  if (!a->backing_->evicts()) {
    // Contract 4: no way to evict, so no budget to keep: a budget without
    // eviction would fail allocations the job could make without spillway.
    a->o_.evict = false;
    a->o_.gpu_budget = 0;
  }
  a->budget_ = Budget(a->o_.gpu_budget, o.host_budget, g);
  a->s_.budget_bytes = a->budget_.gpu();
  a->s_.host_budget_bytes = o.host_budget;
  if (o.background && a->o_.evict && a->budget_.room_for_background()) {
    Allocator* p = a.get();
    a->mover_ = std::make_unique<Mover>(
        d, [p](CUevent done) { return p->begin_background(done); },
        [p] { return p->end_background(); }, o.before_swap, [p] { p->plan_in_background(); });
    a->mover_->start();
    // Its own thread: creating a piece takes tens of milliseconds, which
    // the mover's swaps must not wait behind.
    if (o.host_reserve)
      a->reserver_.start(std::chrono::milliseconds(5), [p] { p->grow_host_reserve(); });
  }
  return a;
}

Allocator::Allocator(const cu::Driver& d, const AllocatorOptions& o)
    : d_(d),
      o_(o),
      arena_(d, 2ull << 20),
      // Staged when a copy first needs it (vmm.h): restores and prefetches.
      dev_(d, device_prop(o.device), &arena_, o.device),
      cache_(d, table_),
      budget_(o.gpu_budget, o.host_budget, 2ull << 20),
      chooser_(o.chooser ? o.chooser : std::make_shared<policy::ScheduleChooser>()),
      schedule_(dynamic_cast<policy::ScheduleChooser*>(chooser_.get())) {}

void Allocator::stop_background() {
  reserver_.stop();
  if (mover_) mover_->stop();
}

Allocator::~Allocator() {
  InternalCalls internal;
  stop_background();
  // Whatever is still queued in this allocator's context may use its memory:
  // it finishes first (the calling thread may have another device current).
  CUcontext popped = nullptr;
  const bool pushed = ctx_ && CU_CALL(d_, cuCtxPushCurrent, ctx_) == CUDA_SUCCESS;
  if (pushed) d_.cuCtxSynchronize();
  if (backing_) backing_->release_all();
  cache_.for_each_chunk([&](uintptr_t va, size_t size, CUmemGenericAllocationHandle h) {
    CU_CALL(d_, cuMemUnmap, va, size);
    dev_.give(h, size);
  });
  if (pushed) CU_CALL(d_, cuCtxPopCurrent, &popped);
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

// ---- malloc and free ------------------------------------------------------

void* Allocator::malloc(size_t size, CUstream stream) {
  InternalCalls internal;
  if (size == 0) return nullptr;
  std::lock_guard lk(mu_);
  // Beyond this, rounding up to the granule would wrap around (to a size of
  // 0): no device has that much memory.
  if (size > std::numeric_limits<size_t>::max() - kMaxGranule) {
    ++s_.ooms;
    log::error("allocation of {} failed: larger than any device's memory", format_bytes(size));
    return nullptr;
  }
  cache_.process_pending();
  // With a mover, the swaps are its remaps; without, an allocation does them.
  if (!mover_ && !arriving_.empty()) finish_prefetches();
  void* p = size < o_.min_block ? malloc_small(size, stream) : malloc_large(size, stream);
  if (!p) {
    ++s_.ooms;
    log::error("allocation of {} failed: {}", format_bytes(size), oom_cause(size));
    log_resident_set("allocation failed");
  }
  note_resident();
  notify_memory();
  if (mover_ && resident_.value > budget_.high()) mover_->wake();
  return p;
}

void Allocator::note_live(Block* b, size_t size, CUstream stream) {
  b->live = true;
  b->size = size;
  b->stream = stream;
  b->last_use = ++tick_;
  table_.add_live(b);
  if (b->large) chooser_->on_alloc(b->ptr);
  live_ += size;
  step_peak_ = std::max(step_peak_, live_.value);
  ++s_.mallocs;
}

void* Allocator::malloc_small(size_t size, CUstream stream) {
  const size_t n = round_up(size, kSmallAlign);
  if (Block* b = cache_.reuse_small(n, stream)) {
    ++s_.cache_hits;
    note_live(b, size, stream);
    return reinterpret_cast<void*>(b->ptr);
  }
  uintptr_t p = cache_.carve_small(n, stream);
  if (p) {
    ++s_.cache_hits;
  } else {
    // A new chunk: VMM device memory in the arena, in every mode.
    const size_t chunk = round_up(std::max(n, kChunk), granule_);
    CUmemGenericAllocationHandle h = 0;
    if (!ensure_context() || take_device(chunk, &h, true) != CUDA_SUCCESS) return nullptr;
    uintptr_t va = arena_.take(chunk);
    if (!va || map_rw(d_, va, chunk, h, o_.device) != CUDA_SUCCESS) {
      if (va) arena_.give(va, chunk);
      dev_.give(h, chunk);
      return nullptr;
    }
    p = cache_.add_chunk(va, chunk, h, stream, n);
  }
  Block* b = table_.make();
  b->ptr = p;
  b->cap = n;
  note_live(b, size, stream);
  return reinterpret_cast<void*>(p);
}

void* Allocator::malloc_large(size_t size, CUstream stream) {
  const size_t cap = round_up(size, granule_);
  step_requested_ += cap;
  Block* b = cache_.take_large(cap, slack(cap, granule_), stream, *streams_);
  if (!b && splits())
    if (void* p = malloc_part(size, stream)) return p;
  // A larger cached block taken here is split (splits()): its room beyond
  // this allocation serves the next ones of its stream, rather than each
  // releasing a cached block and making a new one (five VMM calls, tens of
  // microseconds each on hardware; docs/gpu.md run 6).
  //
  // Any larger one, however much larger: a small allocation that lives long
  // in it (optimizer state, say) pins it on the device, but its eviction
  // copies, and holds host memory for, the live allocations alone
  // (host_backing.cpp), so it costs no more than a block of its own would.
  // A limit of 8x the request cost 1-6% of the median step and twice the
  // bytes moved on an H200 (docs/gpu.md, run 10 against run 9).
  bool split = false;
  if (!b) {
    const bool budgeted = budget_.gpu() != 0;
    const bool pressed = budgeted && !plan_.active() && excess(cap) > 0 && !dev_.has(cap);
    const bool splitting = budgeted && !plan_.active() && splits();
    if (pressed || splitting || !budgeted)
      b = cache_.take_large(cap, wider_slack(cap, pressed || splitting), stream, *streams_);
    split = b && splitting;  // a block taken, not made
  }
  if (b) {
    ++s_.cache_hits;
  } else {
    if (!ensure_context()) return nullptr;
    b = backing_->create(cap, stream);
    if (!b) return nullptr;
  }
  note_live(b, size, stream);
  step_allocated_ += round_up(size, granule_);
  const size_t used = round_up(size, kSmallAlign);
  if (split && b->cap - used >= o_.min_block) {
    b->parts[b->ptr] = size;
    b->spare.give(b->ptr + used, b->cap - used);
    cache_.add_split(b);
    ++s_.split_allocations;
  }
  if (plan_.active()) check_plan_still_fits();
  return reinterpret_cast<void*>(b->ptr);
}

void* Allocator::malloc_part(size_t size, CUstream stream) {
  Block* b = nullptr;
  const uintptr_t p = cache_.take_spare(round_up(size, kSmallAlign), stream, &b);
  if (!p) return nullptr;
  b->parts[p] = size;
  if (p != b->ptr) table_.add_part(p, b);
  b->size = std::max(b->size, p + size - b->ptr);
  b->last_use = ++tick_;
  // The range is new to this allocation: its first writer may be work not
  // yet seen, so a copy waits for the stream's tail until a mark follows it.
  if (!b->marks.empty()) streams_->clear_mark(*b, stream);
  live_ += size;
  step_peak_ = std::max(step_peak_, live_.value);
  ++s_.mallocs;
  ++s_.cache_hits;
  ++s_.split_allocations;
  // Not in step_allocated_: a step plan's model counts the block once.
  return reinterpret_cast<void*>(p);
}

bool Allocator::free_part(Block* b, uintptr_t p, size_t size) {
  b->parts.erase(p);
  if (p != b->ptr) table_.remove_part(p);
  if (b->parts.empty()) {
    // Its last allocation: freed as a block of one.
    b->spare = FreeRanges{};
    cache_.drop_split(b);
    b->size = size;
    return false;
  }
  live_ -= size;
  ++s_.frees;
  // Only its own stream has used the block since it was last free: stream
  // order keeps the range's next owner behind this free's work (contract
  // 3). A range another stream may still be using stays out until the
  // whole block is freed.
  if (b->users.empty()) b->spare.give(p, round_up(size, kSmallAlign));
  // Parts never overlap: the last by address ends last.
  const auto& [last, n] = *b->parts.rbegin();
  b->size = last + n - b->ptr;
  return true;
}

void Allocator::check_plan_still_fits() {
  // Allocated before the next launch: the model's blocks of index <= at.
  const uint32_t at = schedule_->model_index(last_seq_) + 1;
  if (plan_.allocations_match(at, step_allocated_, 4 * granule_)) return;
  plan_.stop();
  ++plan_generation_;  // one being made came from a step like the last, not this one
  plan_job_.reset();
  upcoming_.clear();  // its prefetches not yet started
  ++s_.plans_dropped;
  log::debug(
      "device {}: step plan dropped at launch {}: {} allocated, not what the plan's step had",
      o_.device, at, format_bytes(step_allocated_));
}

Block* Allocator::live_block(uintptr_t p, size_t* allocated) {
  Block* b = table_.live_at(p);
  if (!b) b = table_.part_at(p);
  *allocated = b ? b->size : 0;
  if (b && !b->parts.empty()) {
    auto it = b->parts.find(p);
    *allocated = it == b->parts.end() ? 0 : it->second;
    if (it == b->parts.end()) b = nullptr;  // a split block's start, freed before
  }
  return b;
}

void Allocator::free(void* ptr, size_t size, CUstream stream) {
  if (ptr && !try_free(ptr, size, stream))
    refuse_free(ptr, size, stream,
                "not a live spillway allocation (double free or unknown pointer)");
}

bool Allocator::try_free(void* ptr, size_t size, CUstream stream) {
  InternalCalls internal;
  std::lock_guard lk(mu_);
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  size_t allocated = 0;
  Block* b = live_block(p, &allocated);
  if (!b) return false;
  if (size != allocated) {
    ++s_.bad_frees;
    log::error("free of {} with size {}, but it was allocated with {} bytes; ignored", ptr, size,
               allocated);
    return true;
  }
  // Another stream it is freed on may still have work on it queued: its
  // reuse (contract 3) and an evicted block's host release wait for it too.
  if (stream != b->stream) note_user(b, stream);
  if (!b->parts.empty() && free_part(b, p, size)) return true;
  table_.remove_live(b);
  if (b->large) chooser_->on_free(b->ptr);
  b->live = false;
  b->holds = 0;
  live_ -= b->size;
  ++s_.frees;
  b->last_use = ++tick_;
  if (b->where == Block::Where::kArriving) backing_->abort_prefetch(b);  // its copy is of no use
  if (b->where == Block::Where::kHost) {
    free_evicted(b);
    return true;
  }
  if (b->unmapped && !backing_->remap(b)) {
    // Not cached: whoever took it next would use an address with nothing
    // mapped. Released as an evicted block is, once its queued uses are
    // done: its address may be mapped again for another block.
    free_evicted(b);
    return true;
  }
  streams_->clear_marks(*b);
  if (b->large) streams_->freed(*b);
  // A block freed during its eviction copy keeps its device copy.
  const bool evicting = b->where == Block::Where::kEvicting;
  if (evicting) b->cancel = true;
  // Kept out of use, it waits for no fence and takes no mark.
  if (!cache_.give(b, evicting ? streams_->d2h() : nullptr)) streams_->reused(*b);
  return true;
}

bool Allocator::is_live(const void* ptr) {
  std::lock_guard lk(mu_);
  size_t allocated = 0;
  return live_block(reinterpret_cast<uintptr_t>(ptr), &allocated) != nullptr;
}

void Allocator::refuse_free(const void* ptr, size_t size, CUstream stream, const std::string& why) {
  std::lock_guard lk(mu_);
  ++s_.bad_frees;
  log::error("free of {} ({} bytes, stream {}): {}; ignored", ptr, size,
             static_cast<const void*>(stream), why);
}

void Allocator::free_evicted(Block* b) {
  // Queued work may still read the host copy: let it finish before unmapping.
  // If that cannot be waited for (a stream capturing a graph), the host
  // memory is kept rather than released under work that may read it.
  if (CUresult r = streams_->wait_uses(*b); r != CUDA_SUCCESS) {
    log::error(
        "freeing evicted block {:#x}: its queued uses cannot be waited for ({}); its host "
        "memory is kept",
        b->ptr, cu::describe(d_, r));
    return;
  }
  streams_->clear_marks(*b);
  if (!backing_->release(b)) {
    log::error("freeing evicted block {:#x} failed; its host memory is kept", b->ptr);
    return;
  }
  table_.recycle(b);
}

// ---- the make-room cascade ------------------------------------------------

size_t Allocator::cascade(const std::function<uint64_t()>& short_by, size_t keep,
                          const std::function<size_t(size_t)>& evict_live, bool until_any) {
  // Cached blocks and evicted ones give their handles to the pool: each step
  // after the first trims the pool by what is still short.
  size_t freed = dev_.trim(short_by(), keep);
  if (until_any && freed > 0) return freed;
  for (int step = 0; step < 2; ++step) {
    const uint64_t want = short_by();
    if (want == 0) break;
    size_t got = 0;
    if (step == 0)
      got = release_cached(want);
    else if (evict_live)
      got = evict_live(want);
    freed += got + dev_.trim(short_by(), keep);
    if (until_any && got > 0) break;
  }
  return freed;
}

bool Allocator::make_room(size_t need, bool evict_live) {
  if (budget_.gpu() == 0 || excess(need) == 0) return true;
  // Evictions whose copies are done free their device memory first.
  if (!evicting_.empty() && finish_departed(0, false) > 0 && excess(need) == 0) return true;
  // Freed handles go to the pool; only the excess is released, and a handle
  // of the size about to be taken is kept for it.
  std::function<size_t(size_t)> evict;
  if (o_.evict && evict_live)
    evict = [&](size_t want) {
      budget_.note_over();
      return evict_now(want, Cause::kBudget);
    };
  cascade([&] { return excess(need); }, need, evict, false);
  const uint64_t short_by = excess(need);
  // Without eviction, falling short is an answer, not a failure.
  if (short_by && evict_live)
    log::warn_repeated(cannot_fit_, "cannot fit {} in the GPU budget of {}: {} short",
                       format_bytes(need), format_bytes(budget_.gpu()), format_bytes(short_by));
  return short_by == 0;
}

CUresult Allocator::take_device(size_t size, CUmemGenericAllocationHandle* h, bool evict_live) {
  if (!make_room(size, evict_live)) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult r = dev_.take(size, h);
  // The device may be fuller than the budget says (other processes, other
  // libraries): free `size` more bytes, cheapest first, and retry while
  // anything could be freed.
  size_t freed = 0;
  const bool short_of_device = r == CUDA_ERROR_OUT_OF_MEMORY;
  std::function<size_t(size_t)> evict;
  if (o_.evict && evict_live)
    evict = [&](size_t want) { return evict_now(want, Cause::kPressure); };
  bool retried = false;
  while (r == CUDA_ERROR_OUT_OF_MEMORY) {
    // The device, not the budget, says whether a step freed enough: one step
    // at a time, then the caller's retry.
    const size_t got = cascade([&] { return size; }, size, evict, true);
    if (got == 0 && retried) break;
    // Nothing to free: the driver is asked once more (a failure it does
    // not repeat, or memory another process gave back meanwhile).
    retried = retried || got == 0;
    freed += got;
    r = dev_.take(size, h);
  }
  if (short_of_device && r == CUDA_SUCCESS && o_.observer)
    o_.observer->on_oom_avoided(o_.device, size, freed);
  if (r != CUDA_SUCCESS && evict_live)
    log::warn_repeated(create_failed_, "cuMemCreate({}, device {}) failed: {}", format_bytes(size),
                       o_.device, cu::describe(d_, r));
  return r;
}

size_t Allocator::release_cached(size_t want) {
  return cache_.release(
      want, *streams_,
      [&](uintptr_t va, size_t size, CUmemGenericAllocationHandle h) {
        if (CU_CALL(d_, cuMemUnmap, va, size) != CUDA_SUCCESS) return false;
        arena_.give(va, size);
        dev_.give(h, size);
        return true;
      },
      [&](Block* b) {
        if (!backing_->release(b)) return false;
        ++s_.cached_releases;
        table_.recycle(b);
        return true;
      });
}

// ---- eviction -------------------------------------------------------------

std::vector<Block*> Allocator::choose_victims(size_t want, uint64_t used_after) {
  std::vector<policy::Candidate> cands;
  for (auto& [p, b] : table_.live())
    if (b->large && b->where == Block::Where::kDevice && b->holds == 0 && !b->unmapped)
      cands.push_back({p, b->cap, b->last_use});
  std::vector<Block*> victims;
  for (uint64_t id : used_after == kAnyUse
                         ? chooser_->choose(std::move(cands), want)
                         : chooser_->choose_beyond(std::move(cands), want, used_after))
    victims.push_back(table_.live_at(id));
  return victims;
}

uint64_t Allocator::evicting_bytes() const {
  uint64_t bytes = 0;
  for (const Block* b : evicting_) bytes += b->cancel ? 0 : b->cap;
  return bytes;
}

size_t Allocator::evict_now(size_t want, Cause cause) {
  // A victim whose eviction failed (a driver error in its copy, its host
  // memory or its swap) stays on the device with its bytes. Others are
  // chosen in its place, each failed one held out until this call returns,
  // so that a transient driver failure costs another victim, not an OOM
  // (docs/reliability.md, "Driver failures").
  std::vector<Block*> held_out;
  size_t freed = 0;
  for (int round = 0; round < 3 && freed < want; ++round) {
    const uint64_t failures = s_.evictions_failed;
    const uint64_t in_flight = evicting_bytes();
    std::vector<Block*> victims;
    if (in_flight < want - freed) victims = choose_victims(want - freed - in_flight);
    start_evictions(victims, cause);
    // Contract 1: device memory is given back only once its copy is done.
    freed += finish_departed(want - freed, true);
    if (s_.evictions_failed == failures) break;
    for (Block* b : victims)
      if (b->where == Block::Where::kDevice && b->holds == 0) {
        ++b->holds;
        held_out.push_back(b);
      }
  }
  for (Block* b : held_out) --b->holds;
  return freed;
}

std::vector<Block*> Allocator::start_evictions(const std::vector<Block*>& victims, Cause cause) {
  std::vector<Block*> started;
  for (Block* b : victims) {
    if (b->holds > 0) continue;
    bool failed = false;
    const Backing::Start s = backing_->start_evict(b, budget_.host(), &failed);
    if (failed) ++s_.evictions_failed;
    if (s == Backing::Start::kStop) break;
    if (s != Backing::Start::kStarted) continue;  // its copy failed: the next one
    b->cause = cause;
    b->queued_ns = o_.observer ? monotonic_ns() : 0;
    b->cancel = false;
    streams_->mark_departure(*b);
    evicting_.push_back(b);
    started.push_back(b);
  }
  host_.set(backing_->host_held());
  return started;
}

size_t Allocator::finish_eviction(Block* b, bool copied) {
  streams_->clear_departure(*b);
  size_t freed = 0;
  if (backing_->finish_evict(b, copied)) {
    freed = b->cap;
    ++s_.blocks_evicted;
    s_.bytes_evicted += moved_bytes(*b);
    if (o_.observer)
      o_.observer->on_transfer({true, b->cause, o_.device, b->ptr, moved_bytes(*b), streams_->d2h(),
                                b->queued_ns, monotonic_ns(), nullptr, b->cap});
  } else if (b->cancel) {
    ++s_.evictions_cancelled;
  } else {
    ++s_.evictions_failed;
    log::warn("eviction of {:#x} rolled back (pending work on it, or a driver error)", b->ptr);
  }
  b->cancel = false;
  return freed;
}

size_t Allocator::finish_departed(size_t want, bool wait, const Block* until) {
  // One D2H stream runs the copies in queue order: the first one not done
  // ends a sweep that does not wait.
  size_t freed = 0;
  while (!evicting_.empty()) {
    Block* b = evicting_.front();
    const bool need = wait && (freed < want || (until && until->where == Block::Where::kEvicting));
    CUresult r = need ? streams_->wait_departure(*b) : streams_->departed(*b);
    if (r == CUDA_ERROR_NOT_READY) break;
    // A query that fails says nothing of the copy: wait for it, else its
    // host pieces would be kept out of use for a copy that may be done.
    if (r != CUDA_SUCCESS && !need) r = streams_->wait_departure(*b);
    evicting_.pop_front();
    freed += finish_eviction(b, r == CUDA_SUCCESS);
  }
  return freed;
}

CUresult Allocator::evict(const void* ptr) {
  InternalCalls internal;
  std::lock_guard lk(mu_);
  Block* b = table_.owner_of(reinterpret_cast<uintptr_t>(ptr));
  if (!b || !b->large || !b->live) return CUDA_ERROR_INVALID_VALUE;
  if (b->where == Block::Where::kHost) return CUDA_SUCCESS;
  if (b->where == Block::Where::kEvicting || b->where == Block::Where::kArriving)
    return CUDA_ERROR_NOT_READY;
  if (!ensure_context()) return CUDA_ERROR_INVALID_CONTEXT;
  if (!start_evictions({b}, Cause::kBudget).empty()) finish_departed(0, true, b);
  notify_memory();
  return b->where == Block::Where::kHost ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

// ---- the background mover's round -----------------------------------------

CUevent Allocator::begin_background(CUevent spare) {
  std::lock_guard lk(mu_);
  // The mover's thread makes the context current once.
  if (!mover_has_context_ && !(mover_has_context_ = ensure_context())) return nullptr;
  cache_.process_pending();
  if (!arriving_.empty()) finish_prefetches();
  if (!evicting_.empty()) finish_departed(0, false);
  // A plan places the step's evictions itself: the mover's, chosen by the
  // reactive policy, took blocks the plan keeps, which the plan then
  // evicted others for (steady resnet50 at 40% 1.00-1.06x the ideal against
  // 0.96x without them, llama7b at 60% 1.13-1.21x against 1.10x; simulated).
  if (resident() > budget_.high() && budget_.over_seen() && !plan_.active()) {
    // Down to the low watermark, cheapest first as make_room; live blocks
    // only if the cheap steps leave it above the high one. Copies still in
    // flight count as gone.
    const uint64_t low = budget_.low();
    const uint64_t high = budget_.high();
    cascade([&] { return resident() > high ? resident() - low : 0; }, 0, nullptr, false);
    const uint64_t in_flight = evicting_bytes();
    if (resident() > high + in_flight)
      start_evictions(choose_victims(resident() - in_flight - low), Cause::kBudget);
  }
  // The oldest copy in flight: evictions first, they free device memory.
  CUstream tail = nullptr;
  if (!evicting_.empty()) {
    waited_ = streams_->keep_departure(*evicting_.front());
    tail = streams_->d2h();
  } else if (!arriving_.empty()) {
    if (Block* b = table_.live_at(arriving_.front())) waited_ = streams_->keep_arrival(*b);
    tail = streams_->h2d();
  } else {
    return nullptr;
  }
  if (waited_) return waited_->ev.get();
  return CU_CALL(d_, cuEventRecord, spare, tail) == CUDA_SUCCESS ? spare : nullptr;
}

bool Allocator::end_background() {
  std::lock_guard lk(mu_);
  if (waited_) streams_->let_go(std::exchange(waited_, nullptr));
  if (!arriving_.empty()) finish_prefetches();
  if (!evicting_.empty()) finish_departed(0, false);
  const uint64_t low = budget_.low();
  if (resident() > low) dev_.trim(resident() - low);
  notify_memory();
  ++s_.background_batches;
  return !evicting_.empty() || !arriving_.empty();
}

// ---- uses and restores ----------------------------------------------------

CUresult Allocator::restore(const void* ptr, CUstream stream) {
  InternalCalls internal;
  std::lock_guard lk(mu_);
  Block* b = table_.owner_of(reinterpret_cast<uintptr_t>(ptr));
  if (!b || !b->live) return CUDA_ERROR_INVALID_VALUE;
  b->last_use = ++tick_;
  CUresult r = CUDA_SUCCESS;
  if (b->where == Block::Where::kEvicting) {
    b->cancel = true;
    backing_->cancel_evict(b, &stream);
  } else if (b->where != Block::Where::kDevice) {
    if (!ensure_context()) return CUDA_ERROR_INVALID_CONTEXT;
    use_large(b, &stream, "restore");
    r = b->where == Block::Where::kDevice ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    notify_memory();
  }
  note_user(b, stream);  // after the restore, as in before_use
  return r;
}

void Allocator::note_use(const void* ptr, CUstream stream) {
  std::lock_guard lk(mu_);
  Block* b = table_.owner_of(reinterpret_cast<uintptr_t>(ptr));
  if (b && b->live) note_user(b, stream);
}

bool Allocator::use_large(Block* b, const CUstream* consumer, const char* what) {
  if (b->unmapped && b->where == Block::Where::kDevice && !(ensure_context() && backing_->remap(b)))
    log::error("{} of {:#x}: its address is still unmapped; the work that uses it faults", what,
               b->ptr);
  if (b->where == Block::Where::kEvicting) {
    b->cancel = true;
    backing_->cancel_evict(b, consumer);
    return false;
  }
  if (b->where == Block::Where::kArriving) {
    // Prefetched: the host waits for that one copy (done already if it was
    // issued early enough) and swaps it in before the work is queued.
    if (ensure_context() && backing_->finish_prefetch(b, true)) {
      ++s_.prefetches_used;
      return true;
    }
  }
  if (b->where != Block::Where::kHost) return false;
  // Contract 1: restored before the work is queued (the caller is about to
  // queue it). On failure the host copy stays mapped: slow, correct.
  if (!ensure_context() || restore_block(b, Cause::kOnDemand, consumer) != CUDA_SUCCESS)
    log::warn("{} of {:#x} failed: it is used from host memory", what, b->ptr);
  note_resident();
  return true;
}

size_t Allocator::prefetch(const Touch* touches, size_t n) {
  InternalCalls internal;
  std::lock_guard lk(mu_);
  size_t started = 0;
  auto one = [&](Block* b) {
    if (b->live && b->where == Block::Where::kHost && ensure_context() &&
        prefetch_block(b) == CUDA_SUCCESS)
      ++started;
  };
  for (size_t i = 0; i < n; ++i) table_.for_each_large(touches[i], one);
  if (started) notify_memory();
  return started;
}

CUresult Allocator::prefetch_block(Block* b) {
  const uint64_t queued = o_.observer ? monotonic_ns() : 0;
  const Backing::Start started = backing_->start_prefetch(b);  // evicts no live block
  if (started == Backing::Start::kStop) return CUDA_ERROR_OUT_OF_MEMORY;
  if (started != Backing::Start::kStarted) return CUDA_ERROR_NOT_SUPPORTED;
  arriving_.push_back(b->ptr);
  ++s_.blocks_restored;
  s_.bytes_restored += moved_bytes(*b);
  note_resident();
  // done_ns: when it was queued; its activity record gives the copy's span.
  if (o_.observer)
    o_.observer->on_transfer({false, Cause::kPrefetch, o_.device, b->ptr, moved_bytes(*b),
                              streams_->h2d(), queued, queued, nullptr, b->cap});
  return CUDA_SUCCESS;
}

void Allocator::finish_prefetches() {
  // The H2D stream runs its copies in order: the first still running ends
  // the sweep. Entries whose block was used (swapped then), freed or
  // replaced are dropped.
  size_t done = 0;
  for (; done < arriving_.size(); ++done) {
    Block* b = table_.live_at(arriving_[done]);
    if (!b || b->where != Block::Where::kArriving) continue;
    if (!ensure_context() || !backing_->finish_prefetch(b, false)) {
      if (b->where == Block::Where::kArriving) break;  // still copying
    }
  }
  arriving_.erase(arriving_.begin(), arriving_.begin() + static_cast<std::ptrdiff_t>(done));
}

bool Allocator::before_use(const Access& a, const Touch* touches, size_t n) {
  InternalCalls internal;
  const CUstream stream = a.stream;
  std::lock_guard lk(mu_);
  bool moved = false, held = false;
  // The launch's blocks are held as they come, and stay held until the
  // caller releases them once the work is queued: restoring one must not
  // evict another the same work needs, and no eviction may start on one
  // before the work is in its stream (its copy would not wait for it).
  auto use = [&](Block* b) {
    ++b->holds;
    held = true;
    b->last_use = ++tick_;
    chooser_->on_access({b->ptr, b->size, reinterpret_cast<uint64_t>(stream), a.seq, a.name});
    moved |= use_large(b, &stream, "on-demand restore");
    // After the restore: its copy waits for this stream's mark (the block's
    // last use there), not for all the work queued on it since.
    note_user(b, stream);
  };
  for (size_t i = 0; i < n; ++i)
    table_.for_each_block(touches[i], use, [&](Block* b) { note_user(b, stream); });
  last_seq_ = std::max(last_seq_, a.seq);
  // A job that fits its budget plans nothing: it times no launch either.
  if (o_.plan && schedule_ && budget_.over_seen()) {
    times_.note(a.correlation, schedule_->step_index(a.seq));
    planned_prefetches(a.seq);
  }
  if ((o_.prefetch_launches || !upcoming_.empty()) && budget_.over_seen())
    moved |= prefetch_upcoming(a.seq);
  if (moved) notify_memory();
  return held;
}

void Allocator::planned_prefetches(uint64_t launch) {
  due_.clear();
  const uint32_t at = schedule_->model_index(launch);
  plan_.prefetches_due(at, &due_);
  for (const policy::PlanFollower::Due& d : due_) {
    const uint64_t id = schedule_->live_block(d.block);
    if (id == 0 || d.next_use == policy::Move::kNever || d.next_use <= at) continue;
    add_upcoming(id, launch + (d.next_use - at));
    ++s_.planned_prefetches;
  }
}

void Allocator::planned_evictions() {
  due_.clear();
  const uint32_t at = schedule_->model_index(last_seq_);
  plan_.evictions_due(at, &due_);
  std::vector<Block*> victims;
  for (const policy::PlanFollower::Due& d : due_) {
    if (d.next_use != policy::Move::kNever && d.next_use <= at) continue;  // its gap is over
    Block* b = table_.live_at(schedule_->live_block(d.block));
    if (b && b->large && b->where == Block::Where::kDevice && b->holds == 0) victims.push_back(b);
  }
  if (victims.empty() || !ensure_context()) return;
  // No launch is marked under a plan (after_use): the copies wait for the
  // tails now, and the blocks keep those as their marks for their prefetch.
  streams_->mark_tails(victims);
  s_.planned_evictions += start_evictions(victims, Cause::kBudget).size();
  // The mover finishes them (the swaps are its remaps, not the job's).
  if (mover_) mover_->wake();
}

void Allocator::make_plan() {
  const uint32_t n = schedule_->learned_launches();
  // A plan is only as good as the step it was learned from is like the next:
  // only once two steps in a row had the same launches (within 1%) and about
  // the same peak (within 10%) is the job taken to repeat. A first step that
  // creates the optimizer's state has hundreds more launches; a batch of
  // other sequence lengths has other sizes (a plan for a long step evicts
  // what a short one never needed to).
  const uint32_t before = std::exchange(last_step_len_, n);
  const uint64_t peak_before = std::exchange(last_step_peak_, step_peak_);
  step_peak_ = live_.value;
  auto near = [](uint64_t a, uint64_t b, uint64_t within) {
    return std::max(a, b) - std::min(a, b) <= std::max(a, b) / within;
  };
  const bool repeats =
      before > 0 && n > 0 && near(n, before, 100) && near(last_step_peak_, peak_before, 10);
  // Split blocks stay off (splits()) once a step allocated and freed again
  // the bytes the step before did: the shapes repeat. Those are the large
  // bytes it requested less what it left live beyond the live bytes it began
  // with, so that a first step, which also makes the optimizer's state,
  // counts as the next one: splitting then goes off a step sooner, and the
  // first plan, made from a step of whole blocks, fits the step it is
  // carried into (a plan made from a split step is dropped in an unsplit
  // one). Within a sixteenth: a first step also allocates a few one-off
  // temporaries (vit_b16 3.4%, resnet50 4.1% more than the next step), and
  // the live bytes count small blocks and exact sizes where the requests
  // count large blocks' granules. Not the launches or the peak: those of a
  // first step differ however alike its shapes are. A step of other lengths
  // allocates other bytes.
  const uint64_t grew = live_.value > mark_live_ ? live_.value - mark_live_ : 0;
  mark_live_ = live_.value;
  const uint64_t made = step_requested_ > grew ? step_requested_ - grew : 0;
  const uint64_t made_before = std::exchange(last_step_made_, made);
  steps_repeat_ = made_before > 0 && near(made, made_before, 16);
  ++plan_generation_;  // a plan still being made is for a step that has ended
  plan_job_.reset();
  std::optional<ReadyPlan> ready = std::exchange(ready_plan_, std::nullopt);
  if (!repeats || budget_.gpu() == 0 || !budget_.over_seen()) {
    plan_.stop();
    if (ready) ++s_.plans_dropped;
    return;
  }
  policy::StepModel m = schedule_->learned_step(granule_);
  // A launch never timed (no record yet) counts as the median of those that
  // were; with none at all, as a short kernel.
  constexpr uint64_t kUntimedNs = 10'000;
  // The host's time to issue a launch (SIMCUDA_LAUNCH_NS's default; a few
  // microseconds on hardware).
  constexpr uint64_t kLaunchHostNs = 4'000;
  // Timed by the step's own numbering, the launches the model leaves out
  // included.
  const std::vector<uint32_t>& left_out = schedule_->dropped_launches();
  m.launch_ns = times_.durations(n + static_cast<uint32_t>(left_out.size()), kUntimedNs);
  for (auto i = left_out.rbegin(); i != left_out.rend(); ++i)
    m.launch_ns.erase(m.launch_ns.begin() + *i);
  m.launch_host_ns = kLaunchHostNs;
  m.pinned_bytes = cache_.small_bytes();
  // The plan keeps resident memory a little under the budget (a quarter of
  // the mover's headroom, which stands aside while a plan is followed:
  // begin_background), so that a step that strays a little from the plan's
  // allocates without evicting on the job's thread. The whole headroom
  // moved more and stalled longer: steady llama7b at 60% 1.13x the ideal
  // against 1.10x, vit_b16 at 40% 0.88x against 0.82-0.84x (simulated).
  const uint64_t headroom = (budget_.gpu() - budget_.high()) / 4;
  // The small pool's few chunks come and go (llama7b: 6-12 MiB of a 45 GiB
  // budget, step to step): a change within half the headroom leaves a
  // plan's room inside the budget.
  const uint64_t pinned_slack = headroom / 2;
  // A plan the mover made, while another was followed, during the step that
  // just ended starts now, at a step's start, if that step was the one it
  // was made from again (times aside). Installed mid-step, the moves of the
  // plan it replaces half done, blocks that plan evicted would come back on
  // demand and its room would be made again: on llama7b at 60% such steps
  // took 0.92-1.27 s against 0.77-0.79 s for a step planned from its start
  // (simulated). One made from another step is dropped.
  if (ready && same_step(ready->model, m, 1, pinned_slack))
    install_plan(std::move(ready->model), ready->plan);
  else if (ready)
    ++s_.plans_dropped;
  // The step just learned is the plan's step again (the same blocks, sizes
  // and uses, launch times within 5%): the plan stands. Planning again would
  // cost the mover's thread its time (132 ms on the largest model's size)
  // for a plan like the one already followed.
  if (plan_.active() && planned_model_ && same_step(*planned_model_, m, 20, pinned_slack)) {
    plan_.restart();
    ++s_.plans_kept;
    return;
  }
  policy::PlanOptions po;
  po.budget = budget_.gpu();
  po.headroom = headroom;
  if (!mover_) {
    const policy::Plan plan = policy::plan_step(m, po);
    install_plan(std::move(m), plan);
    return;
  }
  // The steps repeat: the last plan serves this one from its start; the
  // mover's new one starts at the next step mark.
  plan_.restart();
  plan_job_ = PlanJob{std::move(m), po, plan_generation_};
  mover_->wake();
}

void Allocator::grow_host_reserve() {
  InternalCalls internal;
  std::unique_lock lk(mu_);
  if (!o_.evict || o_.host_reserve == 0 || budget_.gpu() == 0 || !budget_.over_seen() ||
      !backing_->evicts() || !ensure_context())
    return;
  // A few pieces per run, so that stopping never waits long.
  size_t made = 0;
  for (int i = 0; i < 4; ++i) {
    const size_t piece = backing_->grow_host_reserve(o_.host_reserve, budget_.host(), lk);
    if (piece == 0) break;
    made += piece;
    s_.host_bytes_created_ahead += piece;  // under the lock that pooled it
  }
  if (made)
    log::debug("device {}: {} of host memory created ahead of evictions", o_.device,
               format_bytes(made));
}

void Allocator::plan_in_background() {
  std::optional<PlanJob> job;
  {
    std::lock_guard lk(mu_);
    job.swap(plan_job_);
  }
  if (!job) return;
  policy::Plan p = policy::plan_step(job->model, job->options);
  std::lock_guard lk(mu_);
  if (job->generation != plan_generation_) return;
  // The first plan starts in the step it was made during, from its next
  // launch, so that the next step starts as the plan has it: with the
  // blocks it carries off the device already off.
  if (!plan_.active())
    install_plan(std::move(job->model), p, schedule_->model_index(last_seq_ + 1));
  else {
    ready_plan_ = ReadyPlan{std::move(job->model), std::move(p)};
    ++s_.plans_deferred;
  }
}

void Allocator::install_plan(policy::StepModel m, const policy::Plan& p, uint32_t from) {
  plan_.start(m, p, from);
  ++s_.plans_made;
  log::debug(
      "device {}: step plan of {} launches ({} timed), {} blocks: {} moves, {} out, {} in, "
      "predicted step {} ns (simulated on a GPU's rules), fits {}",
      o_.device, m.launch_ns.size(), times_.measured(), m.blocks.size(), p.moves.size(),
      format_bytes(p.bytes_out), format_bytes(p.bytes_in), p.step_ns, p.fits);
  planned_model_ = std::move(m);
  check_plan_still_fits();
}

void Allocator::add_upcoming(uintptr_t ptr, uint64_t by) {
  // Soonest use first: a plan names blocks in the order of their prefetch,
  // not of their use, and past its use an entry must go.
  const auto at = std::upper_bound(upcoming_.begin(), upcoming_.end(), by,
                                   [](uint64_t v, const auto& e) { return v < e.second; });
  upcoming_.insert(at, {ptr, by});
}

bool Allocator::prefetch_upcoming(uint64_t launch) {
  named_.clear();
  // A step plan names the blocks to bring back itself (planned_prefetches).
  if (o_.prefetch_launches && !plan_.active()) {
    chooser_->upcoming(o_.prefetch_launches, &named_);
    for (uint64_t id : named_) add_upcoming(id, launch + o_.prefetch_launches);
  }
  while (!upcoming_.empty() && upcoming_.front().second <= launch) upcoming_.pop_front();
  // Soonest use first. A block stays listed until its use: one evicted again
  // meanwhile is brought back again.
  bool started = false;
  for (const auto& [ptr, by] : upcoming_) {
    Block* b = table_.live_at(ptr);
    if (!b || !b->large || b->where != Block::Where::kHost) continue;
    if (!ensure_context()) break;
    // Free room only (pooled handles, cached blocks): a prefetch evicts
    // nothing itself.
    const CUresult r = prefetch_block(b);
    started |= r == CUDA_SUCCESS;
    if (r != CUDA_ERROR_OUT_OF_MEMORY) continue;  // started, or left to the use
    // Room from blocks predicted to be used after this one: their copies are
    // queued now and finished once done (by the mover, or an allocation that
    // needs the room first); this block is tried again at the next launches.
    const uint64_t short_by = excess(b->cap), going = evicting_bytes();
    if (short_by > going)
      start_evictions(choose_victims(short_by - going, by - launch), Cause::kBudget);
    break;
  }
  // The mover finishes the copies (the swaps are its remaps, not the job's).
  if (mover_ && (started || !evicting_.empty())) mover_->wake();
  return started;
}

void Allocator::hold(const Touch* touches, size_t n) {
  InternalCalls internal;
  std::lock_guard lk(mu_);
  bool moved = false;
  auto use = [&](Block* b) {
    ++b->holds;
    // Held for work spillway does not see end (a graph, a collective): its
    // copies wait for the tails of its streams from now on.
    streams_->clear_marks(*b);
    moved |= use_large(b, nullptr, "restore of held block");
  };
  for (size_t i = 0; i < n; ++i)
    table_.for_each_large(touches[i], use);  // small blocks are never evicted
  if (moved) notify_memory();
}

void Allocator::after_use(CUstream stream, const Touch* touches, size_t n) {
  InternalCalls internal;
  std::lock_guard lk(mu_);
  // Marks cost one event record per launch: only once evictions happen (a
  // job that fits its budget records none), and not while a step plan is
  // followed. Its evictions come right after the launch that last uses the
  // block, when the stream's tail is that use: planned_evictions marks the
  // tails then. A mark a launch is 500 ns of the job's thread in the sim:
  // without them resnet50's host-bound step at 60% is 1-2% shorter
  // (simulated: docs/residency.md, session 29).
  const bool mark = budget_.over_seen() && !plan_.active();
  UseMark* m = nullptr;
  bool recorded = false;
  auto done = [&](Block* b) {
    b->holds -= b->holds > 0 ? 1 : 0;
    if (!mark) return;
    if (!recorded) {
      recorded = true;
      m = streams_->record_mark(stream);
    }
    if (m) streams_->set_mark(*b, stream, m);
  };
  for (size_t i = 0; i < n; ++i) table_.for_each_large(touches[i], done);
  if (plan_.active()) planned_evictions();
}

void Allocator::release(const Touch* touches, size_t n) {
  std::lock_guard lk(mu_);
  for (size_t i = 0; i < n; ++i)
    table_.for_each_large(touches[i], [](Block* b) { b->holds -= b->holds > 0 ? 1 : 0; });
}

CUresult Allocator::restore_block(Block* b, Cause cause, const CUstream* consumer) {
  const uint64_t queued = o_.observer ? monotonic_ns() : 0;
  CUresult r = backing_->restore(b, consumer);
  if (r != CUDA_SUCCESS) return r;
  // done_ns is when the block was usable by the consumer: after the copy
  // (host backing), or once the consumer was ordered after the prefetch
  // (managed; nothing waits for that on the host).
  b->where = Block::Where::kDevice;
  ++s_.blocks_restored;
  s_.bytes_restored += moved_bytes(*b);
  if (o_.observer)
    o_.observer->on_transfer({false, cause, o_.device, b->ptr, moved_bytes(*b), streams_->h2d(),
                              queued, monotonic_ns(), nullptr, b->cap});
  return CUDA_SUCCESS;
}

void Allocator::note_user(Block* b, CUstream stream) {
  // Work on `stream` uses it after any mark it has there: a copy waits for
  // that stream's tail until a new mark follows the work (after_use).
  if (!b->marks.empty()) streams_->clear_mark(*b, stream);
  if (stream == b->stream) return;
  if (std::find(b->users.begin(), b->users.end(), stream) == b->users.end())
    b->users.push_back(stream);
}

void Allocator::mark_step(uint64_t end) {
  InternalCalls internal;
  std::lock_guard lk(mu_);
  if (!arriving_.empty()) finish_prefetches();
  // What moved in the step, for a person tracing a job's steps (the exit
  // summary has the totals, SPILLWAY_TRACE every copy).
  ++steps_marked_;
  if (log::get().should_log(spdlog::level::debug))
    log::debug("device {}: step mark {}: {}{}", o_.device, steps_marked_, step_line(s_, at_mark_),
               plan_.active() ? ", a step plan followed" : "");
  at_mark_ = s_;
  chooser_->on_step(end);
  step_allocated_ = 0;
  if (o_.plan && schedule_) make_plan();
  step_requested_ = 0;
}

void Allocator::notify_memory() {
  if (o_.observer)
    o_.observer->on_memory(o_.device, resident(), backing_->host_held(), budget_.gpu());
}

Allocator::Residency Allocator::residency(const void* ptr) {
  std::lock_guard lk(mu_);
  Block* b = table_.owner_of(reinterpret_cast<uintptr_t>(ptr));
  if (!b || !b->live) return Residency::kUnknown;
  switch (b->where) {
    case Block::Where::kDevice:
      return Residency::kDevice;
    case Block::Where::kEvicting:
      return Residency::kEvicting;
    case Block::Where::kHost:
      return Residency::kHost;
    case Block::Where::kArriving:
      return Residency::kArriving;
  }
  return Residency::kUnknown;
}

// ---- statistics -----------------------------------------------------------

void Allocator::reset_recent_peaks() {
  std::lock_guard lk(mu_);
  note_resident();
  resident_.reset_recent_peak();
  live_.reset_recent_peak();
}

Stats Allocator::stats() {
  std::lock_guard lk(mu_);
  Stats s = s_;
  s.resident_bytes = resident();
  s.peak_resident_bytes = resident_.peak;
  s.live_bytes = live_.value;
  s.peak_live_bytes = live_.peak;
  s.recent_peak_resident_bytes = resident_.recent_peak;
  s.recent_peak_live_bytes = live_.recent_peak;
  s.host_bytes = backing_->host_held();
  s.peak_host_bytes = host_.peak;
  // Everything behind live and cached blocks, on either side: fragmentation
  // is what of it no live byte uses.
  s.reserved_bytes =
      (dev_.held() - dev_.pooled()) + backing_->device_beyond_pool() + backing_->host_reserved();
  s.small_pool_bytes = cache_.small_bytes();
  s.device_creates = dev_.creates();
  s.host_creates = backing_->host_creates();
  s.transfer_wait_ns = streams_->waited_ns();
  return s;
}

std::string Allocator::oom_cause(size_t size) {
  // The limit that bound, from what is held now, and the setting to change.
  uint64_t held = 0, movable = 0;
  for (auto& [p, b] : table_.live()) {
    if (!b->large || b->where != Block::Where::kDevice) continue;
    (b->holds > 0 ? held : movable) += b->cap;
  }
  const uint64_t gpu = budget_.gpu(), host = budget_.host(), small = cache_.small_bytes();
  if (!o_.evict || gpu == 0)
    return "nothing can be evicted (SPILLWAY_MODE=off, or no host-memory VMM on this "
           "device: docs/config.md), so the job needs more than the device has";
  if (host && backing_->host_held() + std::min<uint64_t>(size, movable) > host)
    return fmt::format(
        "the host budget is full ({} of SPILLWAY_HOST_BUDGET={} holds evicted blocks), so "
        "nothing more can be evicted: raise SPILLWAY_HOST_BUDGET",
        format_bytes(backing_->host_held()), format_bytes(host));
  if (small > gpu / 2)
    return fmt::format(
        "the small-block pool (blocks under SPILLWAY_MIN_BLOCK={}) holds {} of the GPU budget "
        "of {} and cannot be evicted: lower SPILLWAY_MIN_BLOCK (say to 64KiB) so that more "
        "blocks can move, or raise SPILLWAY_GPU_BUDGET",
        format_bytes(o_.min_block), format_bytes(small), format_bytes(gpu));
  if (movable == 0 && held > 0)
    return fmt::format(
        "every resident block is in use by queued work, a graph, a collective or a pin ({} "
        "held): raise SPILLWAY_GPU_BUDGET, or pin less",
        format_bytes(held));
  if (excess(size) > 0)
    return fmt::format(
        "it does not fit in the GPU budget (SPILLWAY_GPU_BUDGET={}) beside what cannot move "
        "(small-block pool {}, held blocks {}): raise SPILLWAY_GPU_BUDGET",
        format_bytes(gpu), format_bytes(small), format_bytes(held));
  return "the driver has no device memory for it (other processes or libraries hold the "
         "rest of the device): lower SPILLWAY_GPU_BUDGET to what is free, or free the device";
}

void Allocator::log_resident_set(const char* why) {
  std::vector<Block*> res;
  size_t evicted = 0;
  for (auto& [p, b] : table_.live()) {
    if (b->large && b->where != Block::Where::kHost) res.push_back(b);
    if (b->where == Block::Where::kHost) evicted += b->cap;
  }
  std::sort(res.begin(), res.end(), [](Block* a, Block* b) { return a->cap > b->cap; });
  log::error(
      "{}: resident {} of the budget of {}, {} live blocks ({} live, {} evicted to the "
      "host), host {} of {}, small-block pool {}",
      why, format_bytes(resident()), format_bytes(budget_.gpu()), table_.live().size(),
      format_bytes(live_.value), format_bytes(evicted), format_bytes(backing_->host_held()),
      format_bytes(budget_.host()), format_bytes(cache_.small_bytes()));
  for (size_t i = 0; i < res.size() && i < 10; ++i)
    log::error("  resident block {:#x}: {}, stream {}", res[i]->ptr, format_bytes(res[i]->cap),
               static_cast<void*>(res[i]->stream));
}

}  // namespace spillway
