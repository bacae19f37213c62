// The process-wide state of the shim, started on the first call through the
// C ABI: configuration, logging, the driver, and one allocator per device.
// Never destroyed: PyTorch may free memory during interpreter shutdown, after
// static destructors would have run.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include <array>

#include "access.h"
#include "activity.h"
#include "allocator.h"
#include "chrome_trace.h"
#include "config.h"
#include "driver.h"
#include "observers.h"
#include "recorder.h"
#include "sites.h"
#include "term_signals.h"
#include "tracker.h"

namespace spillway {

class Runtime final : public AccessSink {
 public:
  // The runtime, started on first use. A bad configuration ends the process
  // with a message; a missing driver leaves a runtime that allocates nothing.
  static Runtime& get();
  // Null until something started it (stats must not start CUDA).
  static Runtime* peek();

  Allocator* allocator(int device);  // nullptr if it cannot be had (logged once)
  // The device whose allocator holds `ptr` as a live allocation, among
  // those started; -1 if none.
  int device_of(const void* ptr);
  Stats stats();
  // spillway_reset_peak_stats: every allocator's recent peaks.
  void reset_recent_peaks();
  // A training step ended: the observers hear of it, each allocator's
  // policy turns its schedule.
  void mark_step();
  // Every observer (SPILLWAY_STACKS, SPILLWAY_TRACE, SPILLWAY_RECORD), in
  // one list: the C ABI reports allocations and frees to it.
  Observers& observers() { return observers_; }
  // A malloc that returned NULL before reaching an allocator (no driver, bad
  // device): counted with the out-of-memory results.
  void note_unserved() { unserved_.fetch_add(1, std::memory_order_relaxed); }
  // A number for an access spillway reports itself (an NCCL call), from the
  // tracker's sequence when it runs, so that all accesses share one order.
  uint64_t next_access_seq();
  uint64_t steps() const { return steps_.load(std::memory_order_relaxed); }
  const Config& config() const { return cfg_; }

  // AccessSink: the tracker's reports go to the allocator of the device that
  // owns the address.
  bool may_own(uintptr_t p) const override;
  void envelope(uintptr_t* lo, uintptr_t* hi) const override;
  bool before_use(const Access& a, const Touch* touches, size_t n) override;
  void hold(const Touch* touches, size_t n) override;
  void after_use(CUstream stream, const Touch* touches, size_t n) override;
  void release(const Touch* touches, size_t n) override;
  // spillway_prefetch: the evicted blocks under these ranges start back.
  void prefetch(const Touch* touches, size_t n);

 private:
  template <class F>
  void for_each_owner(const Touch* touches, size_t n, F&& f);
  Runtime() = default;
  void start();
  void report_at_exit();
  void report();  // report_at_exit's work, run once
  static void on_term_signal(bool fatal);
  void start_tracking();
  void start_observers();  // SPILLWAY_STACKS, SPILLWAY_TRACE, SPILLWAY_RECORD
  // SPILLWAY_PLAN without a trace or record: the activity reader starts at
  // the first step mark after a budget was crossed.
  void start_launch_records();

  // The launch durations a step plan needs (SPILLWAY_PLAN), from the
  // activity records, to the allocator of the record's device.
  class LaunchRecords final : public cupti::ActivityListener {
   public:
    explicit LaunchRecords(Runtime& r) : r_(r) {}
    void on_records(std::span<const cupti::DeviceRecord> records) override;

   private:
    Runtime& r_;
  };

  Config cfg_;
  const cu::Driver* driver_ = nullptr;
  std::mutex mu_;
  std::vector<std::unique_ptr<Allocator>> allocators_;
  std::vector<bool> failed_;
  static constexpr size_t kMaxDevices = 64;
  std::array<std::atomic<Allocator*>, kMaxDevices> active_{};  // lock-free lookups
  std::atomic<size_t> active_count_{0};
  std::unique_ptr<Tracker> tracker_;
  // The one reader of CUPTI's activity records, for the trace and the record.
  std::unique_ptr<cupti::ActivityReader> activity_;
  std::unique_ptr<Sites> sites_;
  std::unique_ptr<ChromeTrace> trace_;
  std::unique_ptr<Recorder> recorder_;
  // SPILLWAY_STATS, opened (and its path checked) at start, written at exit.
  int stats_fd_ = -1;
  // At exit, or on a SIGTERM/SIGINT that ends the process (on the
  // finisher's thread): once, whichever comes first.
  std::once_flag reported_;
  std::unique_ptr<term_signals::Finisher> finisher_;
  int pid_ = 0;  // the process that started the runtime (a fork's child finishes nothing)
  std::unique_ptr<LaunchRecords> launch_records_;
  Observers observers_;  // the allocators' observer (null when it is empty)
  bool blind_ = false;
  bool plan_ = false;         // SPILLWAY_PLAN in effect (tracker, host mode)
  bool plan_failed_ = false;  // no activity reader for it (warned once)
  // The reader launch_records_ listens to, once there is one (the step marks
  // read it without the lock).
  std::atomic<cupti::ActivityReader*> plan_reader_{nullptr};
  std::atomic<uint64_t> steps_{0};
  std::atomic<uint64_t> unserved_{0};
  std::atomic<uint64_t> own_seq_{0};  // access numbers without a tracker
};

}  // namespace spillway
