#include "recorder.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "log.h"
#include "output_file.h"

namespace spillway {

std::unique_ptr<Recorder> Recorder::open(const std::string& path, std::string* why) {
  std::unique_ptr<Recorder> r(new Recorder);
  r->path_ = path;
  r->owner_pid_ = static_cast<int>(getpid());
  const int fd = open_output(path, why);
  if (fd < 0) return nullptr;
  if (!r->w_.open_fd(fd, path, R"({"source":"shim","format":"spwt"})")) {
    *why = r->w_.error();
    return nullptr;
  }
  // Stream 0 is the legacy default stream (docs/record-format.md).
  r->streams_[nullptr] = 0;
  // The job starts in step 0; spillway_mark_step ends a step (the shim
  // cannot see set-up apart from the first step).
  if (!r->w_.step(0)) {
    *why = r->w_.error();
    return nullptr;
  }
  // A signal handler waits for the activity reader, which waits for this
  // thread's queue lock: a Worker never runs it (base/worker.h).
  r->writer_.start(std::chrono::milliseconds(kPeriodMs), [p = r.get()] { p->drain(); });
  return r;
}

Recorder::~Recorder() {
  close();
}

void Recorder::push(const Event& e, const Touch* touches, size_t n) {
  bool wake = false;
  {
    std::lock_guard lk(queue_mu_);
    if (!accepting_) return;
    Event q = e;
    if (n > 0) {
      q.first = static_cast<uint32_t>(queue_touches_.size());
      q.count = static_cast<uint32_t>(n);
      queue_touches_.insert(queue_touches_.end(), touches, touches + n);
    }
    queue_.push_back(q);
    queue_peak_ = std::max(queue_peak_, queue_.size());
    wake = queue_.size() == kWakeEvents;
  }
  if (wake) writer_.wake();
}

void Recorder::on_alloc(const Allocation& a) {
  if (!a.ptr) return;
  Event e;
  e.kind = Event::Kind::kAlloc;
  e.ptr = reinterpret_cast<uintptr_t>(a.ptr);
  e.value = a.size;
  e.stream = a.stream;
  e.text = a.site;
  push(e);
}

void Recorder::on_free(const Allocation& a) {
  Event e;
  e.kind = Event::Kind::kFree;
  e.ptr = reinterpret_cast<uintptr_t>(a.ptr);
  e.value = a.size;
  e.stream = a.stream;
  push(e);
}

void Recorder::on_access(const Access& a, const Touch* touches, size_t n) {
  Event e;
  e.kind = Event::Kind::kAccess;
  e.access = a.kind;
  e.correlation = a.correlation;
  e.value = a.seq;
  e.stream = a.stream;
  e.text = a.name;
  push(e, touches, n);
}

void Recorder::on_step(uint64_t step) {
  Event e;
  e.kind = Event::Kind::kStep;
  e.value = step;
  push(e);
}

void Recorder::on_transfer(const Transfer& t) {
  Event e;
  e.kind = t.to_host ? Event::Kind::kEvict : Event::Kind::kRestore;
  e.cause = t.cause;
  e.ptr = t.ptr;
  e.value = t.span;
  push(e);
}

void Recorder::on_records(std::span<const cupti::DeviceRecord> records) {
  for (const cupti::DeviceRecord& r : records) {
    if (r.kind != cupti::DeviceRecord::Kind::kKernel || r.end < r.start) continue;
    Event e;
    e.kind = Event::Kind::kDuration;
    e.correlation = r.correlation;
    e.value = r.end - r.start;
    push(e);
  }
}

void Recorder::drain() {
  std::lock_guard lk(write_mu_);
  batch_.clear();
  batch_touches_.clear();
  {
    std::lock_guard q(queue_mu_);
    batch_.swap(queue_);
    batch_touches_.swap(queue_touches_);
  }
  for (const Event& e : batch_) apply(e, batch_touches_.data() + e.first);
}

void Recorder::apply(const Event& e, const Touch* touches) {
  if (broken_) return;
  switch (e.kind) {
    case Event::Kind::kAlloc:
      return write_alloc(e);
    case Event::Kind::kFree:
      return write_free(e);
    case Event::Kind::kAccess:
      return write_access(e, touches);
    case Event::Kind::kStep:
      return write_step(e.value);
    case Event::Kind::kDuration:
      return write_duration(e.correlation, e.value);
    case Event::Kind::kEvict:
    case Event::Kind::kRestore:
      return write_move(e);
  }
}

void Recorder::failed() {
  if (!broken_) log::error("SPILLWAY_RECORD '{}': {}; recording stops", path_, w_.error());
  broken_ = true;
}

uint64_t Recorder::stream_id(CUstream s) {
  auto [it, added] = streams_.try_emplace(s, streams_.size());
  return it->second;
}

uint64_t Recorder::string_id(const char* text) {
  if (!text) return 0;
  if (auto it = names_.find(text); it != names_.end()) return it->second;
  // Two pointers may hold the same text (a kernel loaded twice): one id.
  auto [t, added] = texts_.try_emplace(text, next_string_);
  if (added) {
    if (!w_.string(next_string_, text)) failed();
    ++next_string_;
  }
  names_[text] = t->second;
  return t->second;
}

void Recorder::flush_launch() {
  if (!pending_) return;
  pending_ = false;
  if (broken_) return;
  const uint64_t index = w_.launches();
  if (!w_.launch(pending_stream_, pending_name_, 0, pending_touches_)) return failed();
  if (pending_correlation_) awaiting_[pending_correlation_] = index;
}

void Recorder::write_alloc(const Event& e) {
  flush_launch();
  const uint64_t id = next_alloc_++;
  live_[e.ptr] = {id, e.value};
  const uint64_t site_id = e.text ? string_id(e.text) : 0;
  if (!w_.alloc(id, e.value, stream_id(e.stream), site_id)) failed();
}

void Recorder::write_free(const Event& e) {
  auto it = live_.find(e.ptr);
  // A bad free (unknown pointer, wrong size) is refused by the allocator.
  if (it == live_.end() || it->second.size != e.value) return;
  flush_launch();
  if (!w_.free(it->second.id, stream_id(e.stream))) failed();
  live_.erase(it);
}

void Recorder::write_move(const Event& e) {
  static_assert(static_cast<int>(Cause::kBudget) == static_cast<int>(trace::MoveCause::kBudget) &&
                static_cast<int>(Cause::kOnDemand) ==
                    static_cast<int>(trace::MoveCause::kOnDemand));
  const bool evict = e.kind == Event::Kind::kEvict;
  const auto cause = static_cast<trace::MoveCause>(e.cause);
  // The allocations in the block, as this record knows them. An allocation
  // the record already shows where the move puts it is skipped: the move's
  // event and an allocation's may reach the queue from two threads in the
  // other order (an allocation is reported after its block is handed out,
  // and the mover may evict that block meanwhile), and the record stays
  // consistent (an EVICT of a live, resident allocation, a RESTORE of an
  // evicted one) at the cost of that one move.
  const uintptr_t end = e.ptr + e.value;
  for (auto it = live_.lower_bound(e.ptr); it != live_.end() && it->first < end; ++it) {
    LiveAlloc& a = it->second;
    if (a.evicted == evict) continue;
    a.evicted = evict;
    if (!(evict ? w_.evict(a.id, cause) : w_.restore(a.id, cause))) return failed();
  }
}

void Recorder::write_access(const Event& e, const Touch* touches) {
  if (!pending_ || e.value != pending_seq_) {
    flush_launch();
    pending_ = true;
    pending_seq_ = e.value;
    pending_stream_ = stream_id(e.stream);
    const char* name = e.text;
    if (!name) {
      switch (e.access) {
        case Access::Kind::kCopy:
          name = "[memcpy]";
          break;
        case Access::Kind::kSet:
          name = "[memset]";
          break;
        case Access::Kind::kGraphLaunch:
          name = "[graph]";
          break;
        case Access::Kind::kCollective:
          name = "[collective]";
          break;
        case Access::Kind::kLaunch:
          name = "[kernel]";
          break;
      }
    }
    pending_name_ = string_id(name);
    pending_correlation_ = e.correlation;
    pending_touches_.clear();
  }
  for (size_t i = 0; i < e.count; ++i) {
    const Touch& t = touches[i];
    auto it = live_.upper_bound(t.lo);
    if (it != live_.begin()) --it;
    // Every allocation the range overlaps (a copy may span several).
    for (; it != live_.end() && it->first < t.hi; ++it) {
      const uintptr_t base = it->first;
      const size_t size = it->second.size;
      if (t.lo >= base + size) continue;
      trace::TouchRec r{it->second.id, 0, size, trace::kModeUnknown};
      // A range (a copy, a set) is recorded as it is; a pointer found in a
      // kernel's arguments ({p, p + 1}) as the whole allocation: the kernel
      // may use any of it.
      if (t.hi - t.lo > 1) {
        const uintptr_t lo = std::max<uintptr_t>(t.lo, base);
        r.offset = lo - base;
        r.length = std::min<uintptr_t>(t.hi, base + size) - lo;
      }
      add_touch(r, size);
    }
  }
}

void Recorder::add_touch(const trace::TouchRec& r, size_t size) {
  // A launch that passes the same block twice touches it once.
  auto same = std::find_if(pending_touches_.begin(), pending_touches_.end(),
                           [&](const trace::TouchRec& x) { return x.alloc == r.alloc; });
  if (same == pending_touches_.end()) {
    pending_touches_.push_back(r);
  } else if (same->offset != r.offset || same->length != r.length) {
    const uint64_t lo = std::min(same->offset, r.offset);
    const uint64_t hi = std::max(same->offset + same->length, r.offset + r.length);
    same->offset = lo;
    same->length = std::min<uint64_t>(hi, size) - lo;
  }
}

void Recorder::write_step(uint64_t step) {
  flush_launch();
  if (!w_.step(step)) failed();
}

void Recorder::write_duration(uint32_t correlation, uint64_t duration_ns) {
  if (pending_ && pending_correlation_ == correlation) flush_launch();
  auto it = awaiting_.find(correlation);
  if (it == awaiting_.end()) return;
  if (!w_.duration(it->second, duration_ns)) failed();
  awaiting_.erase(it);
}

void Recorder::close() {
  if (static_cast<int>(getpid()) != owner_pid_) return;
  writer_.stop();
  {
    std::lock_guard q(queue_mu_);
    if (!accepting_) return;
    accepting_ = false;
  }
  // The writer has stopped: what it left is written here, at exit.
  drain();
  std::lock_guard lk(write_mu_);
  if (!w_.is_open()) return;
  flush_launch();
  if (!broken_ && !w_.close()) failed();
  if (!broken_) log::info("SPILLWAY_RECORD: {} records written to {}", w_.records(), path_);
}

uint64_t Recorder::records() const {
  std::lock_guard lk(write_mu_);
  return w_.records();
}

size_t Recorder::queue_peak() const {
  std::lock_guard lk(queue_mu_);
  return queue_peak_;
}

}  // namespace spillway
