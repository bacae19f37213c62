// SPILLWAY_RECORD: the job's replayable trace (docs/record-format.md), as the
// shim sees it: every allocation and free PyTorch makes, every launch, copy
// and set with the allocations it touches, step markers, and kernel
// durations once the activity records bring them.
//
// An observer and an activity listener. The callers' threads only append
// small events to a queue (a mutex held for a copy, never for I/O); a writer
// thread (spillway::Worker) takes the queue every kPeriodMs, or sooner when
// it holds kWakeEvents, and does the rest: resolving touches to allocations,
// interning strings, assembling launches, encoding and writing through
// trace::Writer (which holds at most one block). The queue is not bounded: a
// record with holes would not replay, and the writer empties it many times a
// second (queue_peak() says how far it ever fell behind).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "access.h"
#include "activity.h"
#include "events.h"
#include "trace/trace.h"
#include "worker.h"

namespace spillway {

class Recorder final : public Observer, public cupti::ActivityListener {
 public:
  static constexpr int kPeriodMs = 20;
  static constexpr size_t kWakeEvents = 4096;

  // Creates the file (its header written here, at start) and starts the
  // writer thread; nullptr and why if it cannot be written.
  static std::unique_ptr<Recorder> open(const std::string& path, std::string* why);
  ~Recorder() override;

  // Observer.
  void on_alloc(const Allocation& a) override;
  void on_free(const Allocation& a) override;
  void on_access(const Access& a, const Touch* touches, size_t n) override;
  void on_step(uint64_t step) override;
  // spillway's evictions and restores: EVICT and RESTORE records for the
  // allocations in the moved block.
  void on_transfer(const Transfer& t) override;
  // ActivityListener: kernel durations (by correlation id).
  void on_records(std::span<const cupti::DeviceRecord> records) override;
  // Stops the writer, writes what is queued and the end marker. Idempotent;
  // does nothing in a forked child (the parent owns the file).
  void close();

  uint64_t records() const;
  const std::string& path() const { return path_; }
  // The most events the queue ever held.
  size_t queue_peak() const;

 private:
  // What a caller hands over; the writer does the rest.
  struct Event {
    enum class Kind : uint8_t { kAlloc, kFree, kAccess, kStep, kDuration, kEvict, kRestore };
    Kind kind = Kind::kStep;
    Cause cause = Cause::kBudget;  // kEvict, kRestore
    Access::Kind access = Access::Kind::kLaunch;
    uint32_t correlation = 0;  // kAccess, kDuration
    uintptr_t ptr = 0;         // kAlloc, kFree, kEvict, kRestore
    uint64_t value = 0;        // size (kAlloc, kFree), step, seq (kAccess), duration, span
    CUstream stream = nullptr;
    const char* text = nullptr;     // the site (kAlloc), the kernel name (kAccess)
    uint32_t first = 0, count = 0;  // kAccess: its touches in the queue's touch list
  };

  Recorder() = default;
  void push(const Event& e, const Touch* touches = nullptr, size_t n = 0);
  void drain();  // takes the queue and writes it (the writer, or close())
  void apply(const Event& e, const Touch* touches);
  void write_alloc(const Event& e);
  void write_free(const Event& e);
  void write_move(const Event& e);
  void write_access(const Event& e, const Touch* touches);
  void write_step(uint64_t step);
  void write_duration(uint32_t correlation, uint64_t duration_ns);
  void flush_launch();
  void add_touch(const trace::TouchRec& t, size_t alloc_size);
  uint64_t stream_id(CUstream s);
  uint64_t string_id(const char* text);
  void failed();  // logs the writer's error once, then drops further events

  std::string path_;
  int owner_pid_ = 0;

  // The queue (any thread).
  mutable std::mutex queue_mu_;
  std::vector<Event> queue_;
  std::vector<Touch> queue_touches_;
  bool accepting_ = true;
  size_t queue_peak_ = 0;

  // The writer's state (the writer thread, then close() after it stopped).
  mutable std::mutex write_mu_;
  std::vector<Event> batch_;
  std::vector<Touch> batch_touches_;
  trace::Writer w_;
  bool broken_ = false;
  struct LiveAlloc {
    uint64_t id;
    size_t size;
    bool evicted = false;  // as the record says: an EVICT written, no RESTORE since
  };
  std::map<uintptr_t, LiveAlloc> live_;  // by address: interior pointers resolve with upper_bound
  uint64_t next_alloc_ = 1;
  std::unordered_map<CUstream, uint64_t> streams_;
  std::unordered_map<const char*, uint64_t> names_;  // by pointer: kernel names are stable
  std::unordered_map<std::string, uint64_t> texts_;  // sites and fixed names, by text
  uint64_t next_string_ = 1;
  // The launch being assembled.
  bool pending_ = false;
  uint64_t pending_seq_ = 0;
  uint64_t pending_stream_ = 0;
  uint64_t pending_name_ = 0;
  uint32_t pending_correlation_ = 0;
  std::vector<trace::TouchRec> pending_touches_;
  // Launches waiting for their duration: correlation id -> LAUNCH index.
  std::unordered_map<uint32_t, uint64_t> awaiting_;

  Worker writer_;
};

}  // namespace spillway
