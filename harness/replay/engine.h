// The replay engine (engine.cpp). One per device: it owns what the replay
// creates on that device (the device's primary context is the process's).
// With several devices (--devices), each engine replays the whole record on
// its own device and thread, as a one-process data-parallel job does; they
// meet at each step's end, where device 0's engine marks the step.
#pragma once

#include <cuda.h>

#include <atomic>
#include <barrier>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cu_raii.h"
#include "pattern.h"
#include "replay.h"

struct CUstream_st;

namespace replay {

// Results of the pattern checks, written by kernels on stream workers.
struct Integrity {
  int device = 0;  // named in the report when it is not device 0
  std::atomic<uint64_t> bytes_checked{0};
  void report(uint64_t alloc, uint64_t offset, uint8_t want, uint8_t got, uint64_t launch);
  bool ok();
  std::string first_mismatch();

 private:
  std::mutex mu;
  uint64_t mismatches = 0;
  std::string first;
};

struct KernelWork;  // engine.cpp

struct MemorySample {
  uint64_t t_ns, device_used, host_used;
};

class Engine {
 public:
  // `steps`: the engines of the other devices, met at each step's end
  // (nullptr with one device).
  using StepBarrier = std::barrier<>;
  Engine(const Options& o, const Analysis& a, int device = 0, StepBarrier* steps = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  bool init();
  // Replays the trace. False on an error (error()); an OOM is a result, not
  // an error (oom()).
  bool run();
  // Done with the steps (run returned, or init failed): the other devices'
  // engines stop waiting for this one at the steps' ends. Idempotent.
  void leave_steps();

  const std::string& error() const { return error_; }
  bool device_fault() const { return device_fault_; }
  bool oom() const { return oom_; }
  const std::string& oom_what() const { return oom_what_; }
  Integrity& integrity() { return integrity_; }
  uint64_t steps_completed() const { return steps_completed_; }
  uint64_t median_step_ns() const;
  const std::vector<uint64_t>& step_times() const { return step_times_; }
  const std::vector<std::pair<uint64_t, uint64_t>>& step_spans() const { return step_spans_; }
  // The bytes this device's copies queued beyond the record's own copies
  // (spillway's, or an anchor strategy's) so far: device-to-host,
  // host-to-device. The sim counts a copy when it is queued (api_copy.cpp).
  std::pair<uint64_t, uint64_t> strategy_bytes() const;
  // The same, per step: what was queued from the step before's end (step 0:
  // the set-up too) to the step's end, done or not.
  const std::vector<std::pair<uint64_t, uint64_t>>& step_bytes() const { return step_bytes_; }
  const std::vector<MemorySample>& timeline() const { return timeline_; }
  uint64_t trace_h2d_bytes() const { return trace_h2d_; }
  uint64_t trace_d2h_bytes() const { return trace_d2h_; }
  uint64_t anchor_offload_bytes() const { return offload_bytes_; }
  uint64_t anchor_reload_bytes() const { return reload_bytes_; }
  std::string shim_stats();

 private:
  struct Live {
    unsigned char* ptr = nullptr;  // nullptr: offloaded by an anchor
    uint64_t size = 0;
    uint64_t stream = 0;
    uint64_t last_stream = 0;
    Ranges defined;
    std::unique_ptr<PinnedBuffer> host;  // an anchor's host copy
    bool reloaded = false;
    Event ready;  // an anchor's reload copy, not yet awaited
  };
  struct Pending {
    uint64_t alloc;
    Event done;
  };
  using MallocFn = void* (*)(size_t, int, CUstream_st*);
  using FreeFn = void (*)(void*, size_t, int, CUstream_st*);
  using MarkStepFn = void (*)();
  using StatsFn = size_t (*)(char*, size_t);

  bool fail(std::string why);
  bool cu(CUresult r, const char* what);
  void plan_anchor();
  CUstream stream(uint64_t id);
  bool order(Live& l, uint64_t s);
  void sample_memory();
  bool do_alloc(const spillway::trace::AllocRec& r);
  bool do_free(const spillway::trace::FreeRec& r);
  bool offload(uint64_t id);
  bool release_pending();
  bool reload(uint64_t id, uint64_t use_stream);
  bool ensure(uint64_t id, uint64_t s);
  CUfunction kernel(uint64_t name, size_t n);
  bool launch(uint64_t stream_id, uint64_t name, uint64_t duration_ns,
              const std::vector<spillway::trace::TouchRec>& touches);
  bool copy(const spillway::trace::CopyRec& c);
  bool end_step();
  bool sync_step();  // --step-sync: what a step's end waits for
  void meet_at_step();
  bool finish_oom();
  // The pattern's key for an allocation on this device: the same record on
  // two devices writes different bytes, so a block restored on the wrong
  // device reads wrong.
  uint64_t key(uint64_t alloc) const { return alloc ^ (static_cast<uint64_t>(device_) << 56); }

  const Options& o_;
  const Analysis& a_;
  const int device_;
  StepBarrier* steps_ = nullptr;
  bool left_steps_ = false;  // dropped out of the step barrier
  void* shim_ = nullptr;     // never dlclose'd: its exit handlers run at exit
  MallocFn malloc_ = nullptr;
  FreeFn free_ = nullptr;
  MarkStepFn mark_step_ = nullptr;
  StatsFn stats_json_ = nullptr;

  std::map<uint64_t, Stream> streams_;
  std::map<uint64_t, Event> stream_events_;
  Stream d2h_, h2d_;
  CUfunction corrupt_fn_ = nullptr;
  std::map<std::pair<uint64_t, size_t>, CUfunction> kernels_;
  std::map<size_t, std::vector<size_t>> param_sizes_;
  std::vector<std::string> kernel_names_;

  std::unordered_map<uint64_t, Live> live_;
  std::vector<std::unique_ptr<PinnedBuffer>> host_hold_;
  std::vector<std::unique_ptr<KernelWork>> kernel_work_;  // this step's launches'
  std::vector<Pending> pending_;
  std::unordered_map<uint64_t, Analysis::Saved> plan_;
  std::unordered_map<size_t, std::vector<uint64_t>> offload_after_;
  std::unordered_map<size_t, std::vector<uint64_t>> prefetch_before_;
  std::vector<unsigned char> staging_;

  Integrity integrity_;
  std::string error_;
  bool device_fault_ = false;
  bool oom_ = false;
  std::string oom_what_;
  bool truncated_ = false;
  int64_t step_ = -1;
  uint64_t step_start_ns_ = 0;
  uint64_t steps_completed_ = 0;
  uint64_t total_steps_ = 0;
  uint64_t launches_ = 0;
  std::vector<uint64_t> step_times_;
  std::vector<std::pair<uint64_t, uint64_t>> step_spans_;
  std::vector<std::pair<uint64_t, uint64_t>> step_bytes_;
  std::pair<uint64_t, uint64_t> counted_{0, 0};  // strategy_bytes() at the last step's end
  std::vector<MemorySample> timeline_;
  uint64_t trace_h2d_ = 0, trace_d2h_ = 0;
  uint64_t offload_bytes_ = 0, reload_bytes_ = 0;
};

}  // namespace replay
