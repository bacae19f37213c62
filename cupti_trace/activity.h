// CUPTI activity records (cupti_activity.h) for the trace writer: kernels,
// memcpys and memsets with their device start and end times and correlation
// ids, delivered in buffers from a fixed pool.
//
// Bounded memory: kBuffers buffers of kBufferBytes are allocated once. CUPTI
// asks for a buffer when it has records to store (the request callback) and
// hands it back full (the complete callback, possibly on a driver thread);
// the consumer drains completed buffers and returns them to the pool. When
// every buffer is waiting to be drained, the request waits up to
// kRequestWaitMs for one to come back (the consumer is woken), then gives
// CUPTI no buffer: CUPTI drops the record and counts it (dropped()).
//
// CUPTI's buffer callbacks are process-wide, so there is at most one
// ActivityBuffers per process, and one ActivityReader over it: its thread
// drains the buffers and hands each one's records to every listener (the
// Chrome trace, the .spwt recorder), so that the consumers of the records
// need not agree on which of them reads.
#pragma once

#include <cupti.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "cupti_api.h"
#include "worker.h"

namespace spillway::cupti {

// One activity record, decoded from the CUDA 13 record structs.
struct DeviceRecord {
  enum class Kind : uint8_t { kKernel, kMemcpy, kMemset };
  Kind kind = Kind::kKernel;
  uint8_t copy_kind = 0;  // CUpti_ActivityMemcpyKind (memcpy)
  uint32_t device = 0;
  uint32_t stream = 0;  // CUPTI stream id
  uint32_t correlation = 0;
  uint64_t start = 0, end = 0;  // CUPTI timestamps (ns)
  uint64_t bytes = 0;           // memcpy, memset
  uint32_t value = 0;           // memset
  const char* name = nullptr;   // kernel: valid while the record's buffer is being drained
  int32_t grid[3] = {0, 0, 0};
  int32_t block[3] = {0, 0, 0};
};

class ActivityBuffers {
 public:
  static constexpr size_t kBuffers = 8;
  static constexpr size_t kBufferBytes = 128 * 1024;
  static constexpr int kRequestWaitMs = 200;

  // Registers the buffer callbacks and enables CONCURRENT_KERNEL, MEMCPY and
  // MEMSET. `wake` is called (from any thread, quickly) when a buffer is
  // complete or the pool runs dry. nullptr and a reason on failure.
  static std::unique_ptr<ActivityBuffers> start(const Api& api, void (*wake)(void*), void* ctx,
                                                std::string* why);
  ~ActivityBuffers();
  ActivityBuffers(const ActivityBuffers&) = delete;
  ActivityBuffers& operator=(const ActivityBuffers&) = delete;

  // Asks CUPTI to complete every buffer holding records (cuptiActivityFlushAll).
  void flush();
  // Calls fn(const DeviceRecord&) for every record of every completed buffer,
  // in delivery order, then returns the buffers to the pool. One consumer at
  // a time. Returns the number of records.
  template <class F>
  size_t drain(F&& fn);
  // As drain, but calls fn(std::span<const DeviceRecord>) once per buffer,
  // with `scratch` holding its records (names valid during the call).
  template <class F>
  size_t drain_buffers(std::vector<DeviceRecord>& scratch, F&& fn);

  // Records CUPTI dropped so far (no buffer to put them in).
  uint64_t dropped();
  // The most buffers ever out of the pool at once (at most kBuffers).
  size_t peak_in_use() const { return peak_in_use_.load(std::memory_order_relaxed); }
  uint64_t records() const { return records_; }
  uint64_t unknown_records() const { return unknown_; }
  // Buffers CUPTI could not read to their end (cuptiActivityGetNextRecord
  // failed before CUPTI_ERROR_MAX_LIMIT_REACHED): the records after the
  // failure are lost, and how many is not known.
  uint64_t cut_buffers() const { return cut_.load(std::memory_order_relaxed); }

 private:
  ActivityBuffers(const Api& api, void (*wake)(void*), void* ctx);
  static void CUPTIAPI on_request(uint8_t** buffer, size_t* size, size_t* max_records);
  static void CUPTIAPI on_complete(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t size,
                                   size_t valid);
  void request(uint8_t** buffer, size_t* size);
  void complete(uint8_t* buffer, size_t valid);
  // Moves the completed buffers to `out` (index, valid bytes); returns how many.
  size_t take_completed(std::array<std::pair<size_t, size_t>, kBuffers>& out);
  void recycle(size_t index);
  bool decode(const CUpti_Activity* r, DeviceRecord* out);

  const Api& api_;
  void (*wake_)(void*);
  void* wake_ctx_;
  std::unique_ptr<uint8_t[]> storage_;  // kBuffers * kBufferBytes, 8-byte aligned
  std::mutex mu_;
  std::condition_variable returned_;
  std::array<size_t, kBuffers> free_{};  // a stack of free buffer indices
  size_t free_count_ = 0;
  std::array<std::pair<size_t, size_t>, kBuffers> completed_{};  // FIFO of (index, valid)
  size_t completed_count_ = 0;
  std::atomic<size_t> peak_in_use_{0};
  uint64_t dropped_ = 0;  // CUPTI's count, accumulated (consumer only)
  uint64_t records_ = 0;  // consumer only
  uint64_t unknown_ = 0;  // records of other kinds (consumer only)
  std::atomic<uint64_t> cut_{0};
  // The next record of a buffer: true while there is one; a failure other
  // than the buffer's end counts the buffer as cut.
  bool next_record(uint8_t* base, size_t valid, CUpti_Activity** r) {
    if (valid == 0) return false;
    const CUptiResult res = api_.cuptiActivityGetNextRecord(base, valid, r);
    if (res == CUPTI_SUCCESS) return true;
    if (res != CUPTI_ERROR_MAX_LIMIT_REACHED) cut_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
};

template <class F>
size_t ActivityBuffers::drain(F&& fn) {
  std::array<std::pair<size_t, size_t>, kBuffers> got;
  const size_t n = take_completed(got);
  size_t count = 0;
  for (size_t i = 0; i < n; ++i) {
    uint8_t* base = storage_.get() + got[i].first * kBufferBytes;
    CUpti_Activity* r = nullptr;
    while (next_record(base, got[i].second, &r)) {
      DeviceRecord d;
      if (!decode(r, &d)) continue;
      fn(static_cast<const DeviceRecord&>(d));
      ++count;
    }
    recycle(got[i].first);
  }
  records_ += count;
  return count;
}

template <class F>
size_t ActivityBuffers::drain_buffers(std::vector<DeviceRecord>& scratch, F&& fn) {
  std::array<std::pair<size_t, size_t>, kBuffers> got;
  const size_t n = take_completed(got);
  size_t count = 0;
  for (size_t i = 0; i < n; ++i) {
    uint8_t* base = storage_.get() + got[i].first * kBufferBytes;
    CUpti_Activity* r = nullptr;
    scratch.clear();
    while (next_record(base, got[i].second, &r)) {
      DeviceRecord d;
      if (decode(r, &d)) scratch.push_back(d);
    }
    if (!scratch.empty()) fn(std::span<const DeviceRecord>(scratch.data(), scratch.size()));
    count += scratch.size();
    recycle(got[i].first);
  }
  records_ += count;
  return count;
}

// What a consumer of activity records implements. Called on the reader's
// thread only, one buffer's records at a time, in delivery order.
class ActivityListener {
 public:
  virtual ~ActivityListener() = default;
  // A kernel's name points into the buffer: copy it to keep it.
  virtual void on_records(std::span<const DeviceRecord> records) = 0;
};

class ActivityReader {
 public:
  static constexpr int kFlushMs = 200;  // CUPTI is asked for its partial buffers this often
  static constexpr int kPeriodMs = 50;  // completed buffers wait at most this long

  // Enables the activity records (ActivityBuffers::start). No thread yet:
  // add the listeners, then start(). nullptr and why on failure.
  static std::unique_ptr<ActivityReader> open(const Api& api, std::string* why);
  ~ActivityReader();
  ActivityReader(const ActivityReader&) = delete;
  ActivityReader& operator=(const ActivityReader&) = delete;

  // Before start() only: the list is read without a lock afterwards.
  void listen(ActivityListener* l) { listeners_.push_back(l); }
  bool has_listeners() const { return !listeners_.empty(); }
  // Starts the reader's thread (SIGINT and SIGTERM blocked on it: a signal
  // handler may wait for sync()).
  void start();
  // Flushes CUPTI and waits until the reader's thread has handed every
  // record completed by then to the listeners, at most `timeout`. From any
  // thread but the reader's, and never from a listener. False on timeout,
  // or when the thread is not running.
  bool sync(std::chrono::milliseconds timeout);
  // A last flush and drain, then the thread ends: no listener is called
  // after this returns. Idempotent; does nothing in a forked child.
  void stop();

  const Api& api() const { return api_; }
  // Thread-safe views of ActivityBuffers' counters.
  uint64_t dropped();
  size_t peak_in_use() const { return buffers_->peak_in_use(); }
  uint64_t cut_buffers() const { return buffers_->cut_buffers(); }

 private:
  explicit ActivityReader(const Api& api) : api_(api), owner_pid_(current_pid()) {}
  static int current_pid();
  void pass();  // on the reader's thread

  const Api& api_;
  const int owner_pid_;
  std::unique_ptr<ActivityBuffers> buffers_;
  std::vector<ActivityListener*> listeners_;
  std::vector<DeviceRecord> scratch_;  // the reader's thread only
  uint64_t last_flush_ns_ = 0;         // the reader's thread only
  Worker worker_;
  std::mutex mu_;  // the sync tickets, and CUPTI's dropped count
  std::condition_variable synced_;
  uint64_t sync_asked_ = 0, sync_done_ = 0;
  bool running_ = false;
};

}  // namespace spillway::cupti
