// The allocator of one device: every allocation PyTorch makes passes through
// malloc/free here. It composes the parts below under one lock:
//
//   block.h          one Block and its states
//   block_table.*    address -> block
//   stream_cache.*   stream-ordered reuse: free lists, small chunks, pending frees
//   budget.h         the budget, watermarks and counters
//   backing.h        what backs a large block and how it moves (host_backing.cpp,
//                    managed_backing.cpp): no part above it asks which mode is on
//   copy_streams.*   spillway's copy streams and ordering after the job's streams
//   mover.*          the background mover (eviction ahead of need)
//
// Small blocks (below SPILLWAY_MIN_BLOCK) are carved from pooled chunks and
// never evicted. The budget counts the device physical memory spillway holds
// (live and cached large blocks, pooled handles, small chunks); an allocation
// that would cross it runs the make-room cascade: pooled handles first, then
// cached free blocks, then live blocks chosen by the policy.
#pragma once

#include <cuda.h>

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "access.h"
#include "backing.h"
#include "worker.h"
#include "block.h"
#include "block_table.h"
#include "budget.h"
#include "copy_streams.h"
#include "log.h"
#include "driver.h"
#include "events.h"
#include "launch_times.h"
#include "mover.h"
#include "plan_follower.h"
#include "stats.h"
#include "stream_cache.h"
#include "schedule.h"
#include "victims.h"
#include "vmm.h"

namespace spillway {

struct AllocatorOptions {
  int device = 0;
  uint64_t gpu_budget = 0;   // bytes
  uint64_t host_budget = 0;  // bytes
  // Host memory the background thread creates ahead of evictions once the
  // GPU budget was crossed, so that an eviction rarely creates any (it costs
  // by the byte: 3.2 GB/s on an H200); within the host budget. 0: none.
  uint64_t host_reserve = 0;
  uint64_t min_block = 1ull << 20;
  bool evict = true;  // false in SPILLWAY_MODE=off: caching only
  // Launches ahead of their predicted use at which evicted blocks are
  // prefetched (policy/victims.h, upcoming), into free room only; 0: never.
  uint32_t prefetch_launches = 0;
  // Plan each step's evictions and prefetches from the learned one at its
  // mark (policy/planner.h) and carry the plan out (needs the learned
  // schedule, and launch durations through on_launch_record).
  bool plan = false;
  // SPILLWAY_MODE=managed. Needs CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS;
  // without it, one warning and caching only, as in host mode without
  // host-memory VMM.
  bool managed = false;
  // Evict ahead of need from a background thread when resident memory nears
  // the budget. Safe only when every access is seen (the access tracker can
  // cancel an eviction in flight); see docs/limitations.md.
  bool background = false;
  // Test seam: called by the background thread after an eviction batch's
  // copies completed and before it swaps the mappings (without the lock).
  std::function<void()> before_swap;
  // Told of every transfer and change of memory held (may be null).
  Observer* observer = nullptr;
  // The eviction policy (null: the learned schedule, policy/schedule.h);
  // told of every allocation, free, access and step of large blocks.
  std::shared_ptr<policy::VictimChooser> chooser;
};

class Allocator final : public AccessSink, private DeviceRoom {
 public:
  // Returns nullptr (and why) if the VA arena or copy streams cannot be set up.
  static std::unique_ptr<Allocator> create(const cu::Driver& d, const AllocatorOptions& o,
                                           std::string* why);
  ~Allocator() override;

  void* malloc(size_t size, CUstream stream);
  // Refuses (logs, changes nothing) a pointer that is not a live allocation
  // or a size that differs from the allocation's. A free on another stream
  // than the allocation's makes the block's reuse wait for that stream's
  // work queued so far, as a use on it would.
  void free(void* ptr, size_t size, CUstream stream);
  // As free, but false (nothing logged or counted) when `ptr` is not a live
  // allocation of this device's: the caller says why (another device's?).
  bool try_free(void* ptr, size_t size, CUstream stream);
  // `ptr` is a live allocation of this device's (the start of one).
  bool is_live(const void* ptr);
  // A free this allocator cannot take (`why`): logged, counted, nothing changed.
  void refuse_free(const void* ptr, size_t size, CUstream stream, const std::string& why);

  // Residency, for tests and the access tracker: make the block that
  // contains `ptr` resident before `stream` uses it (cancelling an eviction
  // in flight); evict it to host memory now.
  CUresult restore(const void* ptr, CUstream stream);
  CUresult evict(const void* ptr);
  // Brings the evicted blocks under these ranges back with nobody waiting
  // (spillway_prefetch): each copy runs while the block's address still
  // maps its host copy, and the address moves to the device copy when a use
  // needs it (the host then waits for that copy alone) or once the copy is
  // seen done. Never evicts a live block: one that does not fit now, with
  // pooled and cached memory given back, stays. Returns how many started.
  size_t prefetch(const Touch* touches, size_t n);
  // `stream` uses the block containing `ptr`: its free will wait for that
  // stream's work (what record_stream does, which a pluggable allocator never
  // receives).
  void note_use(const void* ptr, CUstream stream);

  // AccessSink: the tracker reports every launch, copy and set here.
  bool may_own(uintptr_t p) const override { return table_.may_own(p); }
  void envelope(uintptr_t* lo, uintptr_t* hi) const override { table_.envelope(lo, hi); }
  bool before_use(const Access& a, const Touch* touches, size_t n) override;
  void hold(const Touch* touches, size_t n) override;
  void after_use(CUstream stream, const Touch* touches, size_t n) override;
  void release(const Touch* touches, size_t n) override;

  // CUPTI's activity record of the work with this correlation id (any
  // thread, no lock of the allocator's): the launch durations a plan needs.
  void on_launch_record(uint32_t correlation, uint64_t start, uint64_t end) {
    times_.on_record(correlation, start, end);
  }

  enum class Residency { kUnknown, kDevice, kEvicting, kHost, kArriving };
  Residency residency(const void* ptr);

  // A training step ended (spillway_mark_step) after access number `end`
  // (Access::seq): the policy's schedule turns.
  void mark_step(uint64_t end);

  Stats stats();
  // An allocation once had to evict: the job does not fit its budget.
  bool crossed_budget() {
    std::lock_guard lk(mu_);
    return budget_.over_seen();
  }
  // The recent peaks (Stats::recent_peak_*) start again from the levels now.
  void reset_recent_peaks();
  // Stops the background mover (at exit: it must not outlive the logger and
  // the driver). Idempotent.
  void stop_background();
  // Logs the resident set (largest blocks, totals): what a user needs after an OOM.
  void log_resident_set(const char* why);
  // Why an allocation of `size` bytes failed: the limit that bound it and the
  // setting to change (under the lock).
  std::string oom_cause(size_t size);

 private:
  Allocator(const cu::Driver& d, const AllocatorOptions& o);

  void* malloc_small(size_t size, CUstream stream);
  void* malloc_large(size_t size, CUstream stream);
  // Split blocks (block.h): whether this backing splits them (host mode:
  // a managed block's pages migrate one by one); an allocation from a split
  // block's spare room (null if none fits); a free of one of its
  // allocations (false: it was the last, the block is freed whole).
  // Not while the steps' shapes repeat (make_plan) and plans are on: a
  // plan's model is of whole blocks, and parts would make each step's blocks
  // differ from the last (vit_b16's plans were all dropped, simulated);
  // repeating shapes reuse whole blocks anyway.
  bool splits() const { return o_.evict && !o_.managed && !(o_.plan && steps_repeat_); }
  void* malloc_part(size_t size, CUstream stream);
  bool free_part(Block* b, uintptr_t p, size_t size);
  // The bytes a move of `b` copies: its allocations' alone if split.
  static uint64_t moved_bytes(const Block& b) {
    if (b.parts.empty()) return b.size;
    uint64_t n = 0;
    for (const auto& [p, size] : b.parts) n += size;
    return n;
  }
  void note_live(Block* b, size_t size, CUstream stream);
  void note_user(Block* b, CUstream stream);
  // A use of a live large block by `consumer` (null: a hold): cancels its
  // eviction in flight, or restores it (true: a restore was tried).
  bool use_large(Block* b, const CUstream* consumer, const char* what);
  void free_evicted(Block* b);
  // The live block whose allocation starts at `p` (a split block's part
  // too), and that allocation's size; null if none.
  Block* live_block(uintptr_t p, size_t* allocated);

  // DeviceRoom: what the backings and small chunks ask for.
  bool make_room(size_t need, bool evict_live) override;
  CUresult take_device(size_t size, CUmemGenericAllocationHandle* h, bool evict_live) override;
  // The make-room cascade, cheapest first: pooled device handles, cached
  // free blocks, then live blocks (`evict_live`, if given), while
  // `short_by()` says more is needed; a pooled handle of `keep` bytes stays
  // (it is about to be taken). `until_any`: stop after the first step that
  // frees anything. Returns the device bytes given back.
  size_t cascade(const std::function<uint64_t()>& short_by, size_t keep,
                 const std::function<size_t(size_t)>& evict_live, bool until_any);
  // Bytes over the budget if `need` more were taken now.
  uint64_t excess(size_t need) const {
    return budget_.excess(resident() + backing_->added_by(need));
  }
  size_t release_cached(size_t want);
  // Blocks whose eviction frees `want` bytes, as the policy ranks them; only
  // those predicted to be used later than `used_after` launches from now
  // unless it is kAnyUse.
  static constexpr uint64_t kAnyUse = UINT64_MAX;
  std::vector<Block*> choose_victims(size_t want, uint64_t used_after = kAnyUse);
  uint64_t evicting_bytes() const;  // device bytes of the evictions in flight
  // Frees `want` device bytes by eviction now, the host waiting only until
  // they are freed: the copies already in flight first (they are ahead in
  // the D2H queue), new victims only for what those do not cover.
  size_t evict_now(size_t want, Cause cause);
  // Eviction in two steps: the copies are queued (and join `evicting_`), then
  // finished, without the lock between (mover.h) or by whoever needs the room.
  std::vector<Block*> start_evictions(const std::vector<Block*>& victims, Cause cause);
  size_t finish_eviction(Block* b, bool copied);
  // Finishes the evictions in flight, oldest first: those whose copy is done
  // and, with `wait`, those the host waits for until `want` bytes are freed
  // and `until` (if given) is finished. Returns the device bytes freed.
  size_t finish_departed(size_t want, bool wait, const Block* until = nullptr);
  CUresult restore_block(Block* b, Cause cause, const CUstream* consumer);
  CUresult prefetch_block(Block* b);
  // The policy's upcoming blocks that are on the host, prefetched while
  // there is room (a prefetch never evicts); the mover is woken to make
  // more. Those that found none are tried again at the next launches, until
  // their predicted use.
  bool prefetch_upcoming(uint64_t launch);
  void add_upcoming(uintptr_t ptr, uint64_t by);
  // The step plan's moves due at this point of the step: evictions after
  // the launch just queued, prefetches before the one about to be.
  void planned_evictions();
  void planned_prefetches(uint64_t launch);
  // Drops the plan when this step's allocations are not its model's.
  void check_plan_still_fits();
  void make_plan();
  // The step plan queued by make_plan, made on the mover's thread without
  // the lock (about 80 ms at Llama-7B's size) and installed under it.
  void plan_in_background();
  // On its own thread: host memory created ahead of evictions
  // (AllocatorOptions::host_reserve) once the budget was crossed.
  void grow_host_reserve();
  void install_plan(policy::StepModel m, const policy::Plan& p, uint32_t from = 0);
  // Swaps in the prefetches whose copies are done, oldest first.
  void finish_prefetches();
  // The background mover's round, under the lock.
  CUevent begin_background(CUevent spare);
  bool end_background();
  UseMark* waited_ = nullptr;  // the mark the mover waits for, kept out of the pool

  // Device physical memory held: the pool's handles (live, cached, pooled
  // blocks and small chunks) and what the backing holds beyond them.
  uint64_t resident() const { return dev_.held() + backing_->device_beyond_pool(); }
  void note_resident() { resident_.set(resident()); }
  void notify_memory();  // tells the observer what is held now
  bool ensure_context();

  const cu::Driver& d_;
  AllocatorOptions o_;
  size_t granule_ = 0;
  std::mutex mu_;
  CUcontext ctx_ = nullptr;
  VaArena arena_;
  PhysPool dev_;
  BlockTable table_;
  std::unique_ptr<CopyStreams> streams_;
  std::unique_ptr<Backing> backing_;
  StreamCache cache_;
  Budget budget_;
  std::shared_ptr<policy::VictimChooser> chooser_;
  policy::ScheduleChooser* schedule_ = nullptr;  // chooser_, if it learns steps
  policy::PlanFollower plan_;
  LaunchTimes times_;
  uint64_t last_seq_ = 0;       // the latest launch seen (before_use)
  uint32_t last_step_len_ = 0;  // launches in the step learned before the last
  bool steps_repeat_ = false;   // the last two steps' shapes were alike (make_plan)
  // The shapes' fingerprint for steps_repeat_: large bytes requested in this
  // step (granule multiples, split parts included), the live bytes at the
  // last step mark, and what the step before it requested less what it left
  // live beyond what it began with.
  uint64_t step_requested_ = 0, mark_live_ = 0, last_step_made_ = 0;
  uint64_t step_peak_ = 0;       // the most live bytes in this step so far
  uint64_t last_step_peak_ = 0;  // ... in the step just ended
  uint64_t step_allocated_ = 0;  // large bytes allocated in this step (granule multiples)
  std::vector<policy::PlanFollower::Due> due_;
  struct PlanJob {
    policy::StepModel model;
    policy::PlanOptions options;
    uint64_t generation = 0;
  };
  std::optional<PlanJob> plan_job_;  // for the mover to plan
  // A plan the mover has made while another was followed, installed at the
  // next step mark (make_plan) if the step that ended there is like the one
  // it was made from.
  struct ReadyPlan {
    policy::StepModel model;
    policy::Plan plan;
  };
  std::optional<ReadyPlan> ready_plan_;
  // The model the plan being followed was made from (install_plan): a step
  // learned like it keeps the plan rather than planning again (make_plan).
  std::optional<policy::StepModel> planned_model_;
  uint64_t plan_generation_ = 0;  // step marks that asked for a plan
  std::unique_ptr<Mover> mover_;
  Worker reserver_;                 // grow_host_reserve's thread (SPILLWAY_HOST_RESERVE)
  bool mover_has_context_ = false;  // the mover's thread has the context current
  std::vector<Block*> claimed_;     // before_use: the launch's blocks so far
  uint64_t tick_ = 0;
  std::vector<uintptr_t> arriving_;  // prefetches in flight, oldest first
  std::deque<Block*> evicting_;      // evictions in flight, in D2H queue order
  // prefetch_upcoming: blocks named by the policy, and the launch by which
  // each is used (past it, the launch restored it on demand).
  std::deque<std::pair<uintptr_t, uint64_t>> upcoming_;
  std::vector<uint64_t> named_;
  Counter live_, resident_, host_;
  log::Repeats cannot_fit_, create_failed_;  // warnings that may fire at every allocation
  Stats s_;        // event counts; levels and peaks come from the counters
  Stats at_mark_;  // s_ at the last step mark (the step's debug line)
  uint64_t steps_marked_ = 0;
};

}  // namespace spillway
