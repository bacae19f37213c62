// SPILLWAY_RECORD: the job's replayable trace (docs/trace-format.md), as the
// shim sees it: every allocation and free PyTorch makes, every launch, copy
// and set with the allocations it touches, step markers, and kernel
// durations once the activity records bring them.
//
// Launches are buffered until the next event (a launch's touches may arrive
// in several batches, design note in access_sink.h); everything else is
// written at once through trace::Writer, which holds at most one block.
#pragma once

#include <cuda.h>

#include <condition_variable>
#include <cstdint>
#include <thread>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "access.h"
#include "activity.h"
#include "trace/trace.h"

namespace spillway {

class Recorder {
 public:
  // Creates the file; nullptr and why if it cannot be written.
  static std::unique_ptr<Recorder> open(const std::string& path, std::string* why);
  ~Recorder();

  void on_alloc(const void* p, size_t size, CUstream stream, const char* site);
  void on_free(const void* p, size_t size, CUstream stream);
  void on_access(const Access& a, const Touch* touches, size_t n);
  void on_step(uint64_t step);
  // A kernel's device time, from its activity record (by correlation id).
  void on_kernel_time(uint32_t correlation, uint64_t duration_ns);
  // For ChromeTrace::set_record_listener, when SPILLWAY_TRACE reads the
  // activity records.
  static void on_device_record(void* self, const cupti::DeviceRecord& r);
  // Reads the activity records itself (when nothing else does). False, and
  // why, if CUPTI's activity API cannot be had: durations stay 0 (unknown).
  bool collect_durations(const cupti::Api& api, std::string* why);
  // Writes what is buffered and the end marker. Idempotent.
  void close();

  uint64_t records() const;
  const std::string& path() const { return path_; }

 private:
  Recorder() = default;
  void flush_launch();  // with mu_ held
  void add_touch(const trace::TouchRec& t, size_t alloc_size);
  uint64_t stream_id(CUstream s);
  uint64_t string_id(const char* text);
  void failed();  // logs the writer's error once, then drops further events

  mutable std::mutex mu_;
  std::string path_;
  trace::Writer w_;
  bool broken_ = false;
  struct LiveAlloc {
    uint64_t id;
    size_t size;
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
  // Own activity collection (collect_durations): a thread drains the buffers.
  void drain_loop();
  std::unique_ptr<cupti::ActivityBuffers> activity_;
  std::thread drainer_;
  std::mutex wake_mu_;
  std::condition_variable wake_cv_;
  bool wake_ = false, stop_ = false;
};

}  // namespace spillway
