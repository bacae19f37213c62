#include "buffers.h"

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <vector>

#include <cupti.h>

#include "driver.h"
#include "errors.h"
#include "faults.h"
#include "records.h"

namespace simcupti {
namespace {

struct Buffer {
  uint8_t* base;
  size_t size;
  size_t used;         // offset just past the last record; starts past the alignment padding
  size_t max_records;  // 0: as many as fit (CUpti_BuffersCallbackRequestFunc)
  size_t records;

  size_t valid_size() const { return records > 0 ? used : 0; }
  bool has_room(size_t bytes) const {
    return used <= size && size - used >= bytes && (max_records == 0 || records < max_records);
  }
};

Buffer make_buffer(uint8_t* base, size_t size, size_t max_records) {
  const auto addr = reinterpret_cast<uintptr_t>(base);
  const uintptr_t aligned =
      (addr + ACTIVITY_RECORD_ALIGNMENT - 1) & ~uintptr_t{ACTIVITY_RECORD_ALIGNMENT - 1};
  return Buffer{base, size, static_cast<size_t>(aligned - addr), max_records, 0};
}

// A buffer on its way back to the client, with the callback it goes to.
struct Completed {
  CUpti_BuffersCallbackCompleteFunc complete;
  Buffer buffer;
};

struct State {
  std::mutex mu;
  std::condition_variable idle;  // signalled when in_flight drops to 0
  CUpti_BuffersCallbackRequestFunc request = nullptr;
  CUpti_BuffersCallbackCompleteFunc complete = nullptr;
  // Bumped whenever the callbacks change, so that a buffer requested under
  // the old ones goes back to the old complete callback.
  uint64_t generation = 0;
  std::optional<Buffer> current;
  // Buffers a thread requested while another thread installed its own.
  std::vector<Buffer> spare;
  size_t dropped = 0;
  // Buffers taken out of the state but not yet through the complete
  // callback; a flush waits for them so that it really returns every record.
  size_t in_flight = 0;
};

// Leaked on purpose: stream workers may still complete work during exit.
State& state() {
  static auto* s = new State;
  return *s;
}

// Nonzero while this thread is inside a complete callback, which may itself
// flush: it must not then wait for its own delivery to finish.
thread_local int t_delivering = 0;

void retire(State& s, const Buffer& b, CUpti_BuffersCallbackCompleteFunc complete,
            std::vector<Completed>& out) {
  ++s.in_flight;
  out.push_back({complete, b});
}

// Hands back `current` (if it holds records, or always with `all`) and, with
// `all`, the spare buffers too. Caller holds s.mu.
void retire_held(State& s, bool all, std::vector<Completed>& out) {
  if (s.current && (all || s.current->records > 0)) {
    retire(s, *s.current, s.complete, out);
    s.current.reset();
  }
  if (all) {
    for (const Buffer& b : s.spare) retire(s, b, s.complete, out);
    s.spare.clear();
  }
}

// Outside the lock: a complete callback may call back into CUPTI.
void deliver(std::vector<Completed>& out) {
  if (out.empty()) return;
  ++t_delivering;
  for (const Completed& c : out)
    c.complete(nullptr, 0, c.buffer.base, c.buffer.size, c.buffer.valid_size());
  --t_delivering;
  State& s = state();
  std::lock_guard lock(s.mu);
  s.in_flight -= out.size();
  if (s.in_flight == 0) s.idle.notify_all();
}

void wait_idle(State& s) {
  if (t_delivering > 0) return;
  std::unique_lock lock(s.mu);
  s.idle.wait(lock, [&] { return s.in_flight == 0; });
}

// Asks the client for a buffer, without the lock (the request callback may
// take its time or call CUPTI), and installs it. Caller holds `lock`.
void request_buffer(State& s, std::unique_lock<std::mutex>& lock, std::vector<Completed>& out) {
  const auto request = s.request;
  const auto complete = s.complete;
  const uint64_t generation = s.generation;
  uint8_t* base = nullptr;
  size_t size = 0;
  size_t max_records = 0;
  lock.unlock();
  request(&base, &size, &max_records);
  lock.lock();
  if (base == nullptr) return;
  const Buffer b = make_buffer(base, size, max_records);
  // A buffer that cannot hold the largest record is given back unused rather
  // than kept, so the client gets its memory back and sees validSize 0.
  if (generation != s.generation || !b.has_room(kMaxRecordSize)) {
    retire(s, b, complete, out);
  } else if (!s.current) {
    s.current = b;
  } else {
    s.spare.push_back(b);
  }
}

}  // namespace

void append_record(const void* record, size_t size) {
  State& s = state();
  std::vector<Completed> out;
  {
    std::unique_lock lock(s.mu);
    if (!s.current && !s.spare.empty()) {
      s.current = s.spare.back();
      s.spare.pop_back();
    }
    if (!s.current && s.request != nullptr) request_buffer(s, lock, out);
    if (!s.current) {
      ++s.dropped;
    } else {
      Buffer& b = *s.current;
      std::memcpy(b.base + b.used, record, size);
      b.used += size;
      ++b.records;
      // Complete as soon as any record might not fit, so that a full buffer
      // reaches the client now rather than at the next record or flush.
      if (!b.has_room(kMaxRecordSize)) {
        retire(s, b, s.complete, out);
        s.current.reset();
      }
    }
  }
  deliver(out);
}

void release_buffers() {
  State& s = state();
  std::vector<Completed> out;
  {
    std::lock_guard lock(s.mu);
    retire_held(s, true, out);
    s.request = nullptr;
    s.complete = nullptr;
    ++s.generation;
    s.dropped = 0;
  }
  deliver(out);
  wait_idle(s);
}

}  // namespace simcupti

using simcupti::ret;

// Registering different callbacks hands the buffers held so far back to the
// previous complete callback first: they came from the previous allocator.
CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc funcBufferRequested,
                                           CUpti_BuffersCallbackCompleteFunc funcBufferCompleted) {
  if (CUptiResult f = simcupti::injected("cuptiActivityRegisterCallbacks"); f != CUPTI_SUCCESS)
    return simcupti::ret(f);
  using namespace simcupti;
  if (driver() == nullptr) return ret(CUPTI_ERROR_NOT_INITIALIZED);
  if (funcBufferRequested == nullptr || funcBufferCompleted == nullptr)
    return ret(CUPTI_ERROR_INVALID_PARAMETER);
  State& s = state();
  std::vector<Completed> out;
  {
    std::lock_guard lock(s.mu);
    if (s.request != funcBufferRequested || s.complete != funcBufferCompleted) {
      if (s.complete != nullptr) retire_held(s, true, out);
      s.request = funcBufferRequested;
      s.complete = funcBufferCompleted;
      ++s.generation;
    }
  }
  deliver(out);
  return CUPTI_SUCCESS;
}

// Every record is complete when it is appended (the driver reports work once
// it has finished), so the default and the forced flush both deliver every
// buffer holding records, partly filled ones included.
CUptiResult cuptiActivityFlushAll(uint32_t flag) {
  if (CUptiResult f = simcupti::injected("cuptiActivityFlushAll"); f != CUPTI_SUCCESS)
    return simcupti::ret(f);
  using namespace simcupti;
  (void)flag;
  if (driver() == nullptr) return ret(CUPTI_ERROR_NOT_INITIALIZED);
  State& s = state();
  std::vector<Completed> out;
  {
    std::lock_guard lock(s.mu);
    if (s.request == nullptr) return ret(CUPTI_ERROR_INVALID_OPERATION);
    retire_held(s, false, out);
  }
  deliver(out);
  wait_idle(s);
  return CUPTI_SUCCESS;
}

// cupti_activity.h: "CONTEXT and STREAMID will be ignored. Use
// cuptiActivityFlushAll".
CUptiResult cuptiActivityFlush(CUcontext context, uint32_t streamId, uint32_t flag) {
  (void)context;
  (void)streamId;
  return cuptiActivityFlushAll(flag);
}

// All buffers are global (cupti_activity.h, CUpti_BuffersCallbackCompleteFunc),
// so there is one dropped count whatever the context and stream.
CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext context, uint32_t streamId,
                                              size_t* dropped) {
  if (CUptiResult f = simcupti::injected("cuptiActivityGetNumDroppedRecords"); f != CUPTI_SUCCESS)
    return simcupti::ret(f);
  using namespace simcupti;
  (void)context;
  (void)streamId;
  if (driver() == nullptr) return ret(CUPTI_ERROR_NOT_INITIALIZED);
  if (dropped == nullptr) return ret(CUPTI_ERROR_INVALID_PARAMETER);
  State& s = state();
  std::lock_guard lock(s.mu);
  *dropped = s.dropped;
  s.dropped = 0;
  return CUPTI_SUCCESS;
}
