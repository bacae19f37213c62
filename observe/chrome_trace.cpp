#include "chrome_trace.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "access.h"
#include "chrome_events.h"
#include "json.h"
#include "output_file.h"
#include "term_signals.h"
#include "spillway_version.h"

namespace spillway {
namespace {

// Tracks of spillway's own copies, one per direction, in each GPU's process.
// CUPTI stream ids are small integers, far below these.
constexpr uint64_t kTidEvict = 1000000001;    // device to host
constexpr uint64_t kTidRestore = 1000000002;  // host to device
constexpr size_t kMaxTracks = 1024;
constexpr size_t kMaxName = 256;
constexpr int kSignalWaitMs = 2000;  // a signal handler's wait for the writer
// The writer's wait for the activity reader on a signal: well inside the
// handler's wait, so that the rest is still written when CUPTI is slow.
constexpr int kSignalSyncMs = 1000;

const char* copy_kind_name(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA:
      return "HtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH:
      return "AtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA:
      return "AtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD:
      return "AtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA:
      return "DtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
      return "HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return "PtoP";
    default:
      return "unknown";
  }
}

// The simulated driver exports its own API next to CUDA's.
bool driver_is_simulated() {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h) return false;
  const bool sim = dlsym(h, "simcuda_now_ns") != nullptr;
  dlclose(h);
  return sim;
}

// Signal handling (install_signal_handlers): the trace of the process.
std::atomic<ChromeTrace*> g_signal_trace{nullptr};

void on_term_signal(bool fatal) {
  if (ChromeTrace* t = g_signal_trace.load(std::memory_order_acquire)) t->signal_flush(fatal);
}

}  // namespace

// A few words, trivially copyable: what a producer hands over.
struct ChromeTrace::HostEvent {
  enum class Kind : uint8_t { kTransfer, kMemory, kOom, kInternalCopy };
  Kind kind = Kind::kMemory;
  bool to_host = false;
  Cause cause = Cause::kBudget;
  int32_t device = 0;
  uint32_t correlation = 0;      // kInternalCopy: the copy's
  uint32_t for_correlation = 0;  // kTransfer: the driver call it was made for (0: none)
  uint64_t ptr = 0, bytes = 0;
  uint64_t a = 0, b = 0, c = 0;  // see push sites
  uint64_t span = 0;             // kTransfer: the block's extent from ptr (Transfer::span)
  uint64_t at = 0;               // trace clock when it was observed
  const char* site = nullptr;    // kTransfer: the block's allocation site (SPILLWAY_STACKS)
};

namespace {

// A block's move as one record: its copies' records merged, from the first
// start to the last end (the copies of one move run one after another on its
// stream), their bytes summed.
void merge_record(cupti::DeviceRecord& into, const cupti::DeviceRecord& r) {
  if (into.bytes == 0) {
    into = r;
    return;
  }
  into.start = std::min(into.start, r.start);
  into.end = std::max(into.end, r.end);
  into.bytes += r.bytes;
}

}  // namespace

// The writer's bounded tables joining spillway's copies to their activity
// records by correlation id. Each holds at most `cap` entries; when full,
// the oldest goes out as it is (a transfer on the host clock, a copy as not
// committed), so nothing grows and nothing is lost.
//
// A block's move is one copy per host piece and live range (host_backing.cpp:
// a block over 64 MiB, a split block), each with its own correlation id and
// source address inside the block: a transfer takes every copy on its stream
// from [ptr, ptr + span), and is written once all of their records are in,
// from the first one's start to the last one's end.
struct ChromeTrace::Join {
  struct Copy {  // spillway's copy from address `src` on `stream`, as called
    uint64_t src = 0, stream = 0, seq = 0;
    uint32_t correlation = 0;
  };
  struct Waiting {  // a transfer whose copies' records have not all arrived
    HostEvent t;
    std::vector<uint32_t> correlations;  // those still to come
    cupti::DeviceRecord done{};          // those in so far, merged (bytes: 0 for none)
    uint64_t seq = 0;
  };
  struct Record {  // a record of spillway's copy whose transfer has not arrived
    cupti::DeviceRecord r;
    uint64_t stream = 0, seq = 0;
  };
  explicit Join(size_t cap) : cap(cap) {}
  size_t cap;
  uint64_t seq = 0;
  std::vector<Copy> copies;
  std::vector<Waiting> waiting;
  std::vector<Record> records;
  size_t peak = 0;
  template <class V>
  size_t oldest(const V& v) const {
    size_t o = 0;
    for (size_t i = 1; i < v.size(); ++i)
      if (v[i].seq < v[o].seq) o = i;
    return o;
  }
  size_t note() { return peak = std::max({peak, copies.size(), waiting.size(), records.size()}); }
};

ChromeTrace::ChromeTrace(std::string path, cupti::ActivityReader* activity, Limits limits)
    : path_(std::move(path)),
      activity_(activity),
      api_(activity ? &activity->api() : nullptr),
      limits_(limits),
      owner_pid_(getpid()) {}

std::unique_ptr<ChromeTrace> ChromeTrace::open(const std::string& path,
                                               cupti::ActivityReader* activity, std::string* why,
                                               Limits limits) {
  limits.ring_events = std::max<size_t>(limits.ring_events, 16);
  limits.out_bytes = std::max<size_t>(limits.out_bytes, 8192);
  limits.join_slots = std::max<size_t>(limits.join_slots, 4);
  limits.flush_ms = std::max(limits.flush_ms, 1);
  std::unique_ptr<ChromeTrace> t(new ChromeTrace(path, activity, limits));
  const int fd = open_output(path, why);
  if (fd < 0) return nullptr;
  t->out_ = std::make_unique<ChromeEventWriter>(fd, limits.out_bytes);
  t->ring_.reset(new HostEvent[limits.ring_events]);
  t->batch_.reset(new HostEvent[limits.ring_events]);
  t->join_ = std::make_unique<Join>(limits.join_slots);
  t->join_->copies.reserve(limits.join_slots);
  t->join_->waiting.reserve(limits.join_slots);
  t->join_->records.reserve(limits.join_slots);
  t->tracks_.reserve(kMaxTracks);
  t->c_.ring_cap = limits.ring_events;
  t->c_.spill_cap = limits.spill_events;
  t->c_.out_cap = t->out_->buffer_bytes();
  t->c_.join_cap = limits.join_slots;
  t->sim_driver_ = driver_is_simulated();
  if (activity) t->c_.activity_buffers = cupti::ActivityBuffers::kBuffers;
  // The simulator's CUPTI clock is its virtual clock; CLOCK_MONOTONIC is real
  // time, even over the simulator.
  t->simulated_ = t->sim_driver_ && t->api_;
  // One timeline: CUPTI's clock when there is one (activity records use it,
  // and host-side events are stamped with cuptiGetTimestamp when observed),
  // else CLOCK_MONOTONIC. Timestamps are written relative to a base one
  // second before the start (threads of the simulator whose virtual clock is
  // behind the opening thread's stay positive; 0 when the clock is younger).
  t->start_trace_ns_ = t->now();
  t->start_monotonic_ns_ = monotonic_ns();
  t->base_ = t->start_trace_ns_ > 1000000000ull ? t->start_trace_ns_ - 1000000000ull : 0;
  t->line(
      "{\"name\":\"spillway trace start\",\"ph\":\"i\",\"s\":\"g\",\"pid\":0,\"tid\":0,\"ts\":%s,"
      "\"args\":{\"spillway_version\":\"%s\",\"schema\":%d,\"clock\":\"%s\",\"simulated_time\":%s,"
      "\"simulated_gpu\":%s,\"base_ns\":"
      "%" PRIu64 ",\"trace_clock_at_start_ns\":%" PRIu64 ",\"monotonic_at_start_ns\":%" PRIu64
      ",\"pid\":%d}}",
      t->ts(t->start_trace_ns_).c_str(), kVersion, kJsonSchema,
      t->api_ ? "cupti (cuptiGetTimestamp and activity records)" : "host (CLOCK_MONOTONIC)",
      t->simulated_ ? "true" : "false", t->sim_driver_ ? "true" : "false", t->base_,
      t->start_trace_ns_, t->start_monotonic_ns_, t->owner_pid_);
  // The start line goes out with the writer's first pass: nothing is written
  // on the caller's thread.
  t->writer_ = std::make_unique<Worker>();
  // A Worker blocks SIGTERM and SIGINT: the handler waits for this thread.
  t->writer_->start(std::chrono::milliseconds(limits.flush_ms), [p = t.get()] { p->run(); });
  return t;
}

ChromeTrace::~ChromeTrace() {
  finish();
  ChromeTrace* self = this;
  g_signal_trace.compare_exchange_strong(self, nullptr);
  if (getpid() != owner_pid_) (void)writer_.release();  // a fork's copy: no thread to join
}

uint64_t ChromeTrace::now() const {
  uint64_t t = 0;
  if (api_ && api_->cuptiGetTimestamp(&t) == CUPTI_SUCCESS) return t;
  return monotonic_ns();
}

void ChromeTrace::push(const HostEvent& e) {
  // Never waits for the writer: the caller may hold the allocator's lock.
  bool wake = false;
  {
    std::lock_guard lk(ring_mu_);
    if (!accepting_) {
      ++late_;
      return;
    }
    if (ring_count_ < limits_.ring_events && spill_.empty()) {
      ring_[(ring_head_ + ring_count_) % limits_.ring_events] = e;
      ++ring_count_;
      ring_peak_ = std::max(ring_peak_, ring_count_);
      wake = ring_count_ == limits_.ring_events / 2;
    } else if (spill_.size() < limits_.spill_events) {
      // Behind the ring's events, so that the writer keeps their order.
      spill_.push_back(e);
      spill_peak_ = std::max(spill_peak_, spill_.size());
      wake = spill_.size() == 1;
    } else {
      ++dropped_;
      return;
    }
  }
  if (wake) writer_->wake();
}

void ChromeTrace::on_transfer(const Transfer& t) {
  HostEvent e;
  e.kind = HostEvent::Kind::kTransfer;
  e.to_host = t.to_host;
  e.cause = t.cause;
  e.device = t.device;
  e.for_correlation = CurrentCall::correlation();
  e.ptr = t.ptr;
  e.bytes = t.bytes;
  e.a = reinterpret_cast<uint64_t>(t.stream);
  e.b = t.queued_ns;
  e.c = t.done_ns;
  e.span = t.span;
  e.site = t.site;
  e.at = now();
  push(e);
}

void ChromeTrace::on_memory(int device, uint64_t resident, uint64_t host, uint64_t budget) {
  {
    // Unchanged samples add nothing to a counter track.
    std::lock_guard lk(ring_mu_);
    if (device >= 0 && device < 1024) {
      const auto d = static_cast<size_t>(device);
      if (last_memory_.size() <= d) last_memory_.resize(d + 1);
      LastMemory& m = last_memory_[d];
      if (m.resident == resident && m.host == host && m.budget == budget) return;
      m = {resident, host, budget};
    }
  }
  HostEvent e;
  e.kind = HostEvent::Kind::kMemory;
  e.device = device;
  e.a = resident;
  e.b = host;
  e.c = budget;
  e.at = now();
  push(e);
}

void ChromeTrace::on_oom_avoided(int device, size_t need, size_t freed) {
  HostEvent e;
  e.kind = HostEvent::Kind::kOom;
  e.device = device;
  e.a = need;
  e.b = freed;
  e.at = now();
  push(e);
}

void ChromeTrace::on_own_copy(const OwnCopy& c) {
  HostEvent e;
  e.kind = HostEvent::Kind::kInternalCopy;
  e.correlation = c.correlation;
  e.ptr = c.src;
  e.bytes = c.bytes;
  e.a = reinterpret_cast<uint64_t>(c.stream);
  push(e);
}

std::string ChromeTrace::ts(uint64_t t) {
  if (t < base_) {
    std::lock_guard lk(counters_mu_);
    ++c_.clamped;
    t = base_;
  }
  return ChromeEventWriter::micros(t - base_);
}

void ChromeTrace::line(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  out_->vevent(fmt, ap);
  va_end(ap);
  std::lock_guard lk(counters_mu_);
  c_.out_peak = out_->buffered_peak();
}

void ChromeTrace::write_out() {
  out_->flush();
  std::lock_guard lk(counters_mu_);
  c_.bytes_written = out_->bytes_written();
}

void ChromeTrace::ensure_track(uint32_t pid, uint64_t tid) {
  for (const auto& t : tracks_)
    if (t.first == pid && t.second == tid) return;
  if (tracks_.size() >= kMaxTracks) return;  // unnamed beyond this
  bool new_pid = true;
  for (const auto& t : tracks_) new_pid = new_pid && t.first != pid;
  tracks_.emplace_back(pid, tid);
  if (new_pid)
    out_->process_name(pid, "GPU " + std::to_string(pid) +
                                (simulated_    ? " (simulated time)"
                                 : sim_driver_ ? " (simulated GPU, host time)"
                                               : ""));
  if (tid == kTidEvict || tid == kTidRestore) {
    out_->thread_name(pid, tid,
                      tid == kTidEvict ? "spillway evictions (device to host)"
                                       : "spillway restores (host to device)");
    out_->thread_sort_index(pid, tid, tid == kTidEvict ? -2 : -1);
  } else {
    out_->thread_name(pid, tid, "stream " + std::to_string(tid));
  }
}

void ChromeTrace::emit_transfer(const HostEvent& t, const cupti::DeviceRecord* r) {
  const uint64_t tid = t.to_host ? kTidEvict : kTidRestore;
  const auto pid = static_cast<uint32_t>(t.device);
  ensure_track(pid, tid);
  uint64_t start, end;
  if (r) {
    start = r->start;
    end = std::max(r->end, r->start);
  } else {
    // Host clock: the copy's duration from CLOCK_MONOTONIC, ending when
    // spillway saw it complete (stamped on the trace clock then).
    const uint64_t dur = t.c > t.b ? t.c - t.b : 0;
    end = t.at;
    start = end > dur ? end - dur : 0;
  }
  char block[32];
  std::snprintf(block, sizeof block, "0x%" PRIx64, t.ptr);
  char corr[64] = "";
  if (r) std::snprintf(corr, sizeof corr, ",\"correlation\":%u", r->correlation);
  char for_corr[64] = "";
  if (t.for_correlation)
    std::snprintf(for_corr, sizeof for_corr, ",\"for_correlation\":%u", t.for_correlation);
  std::string site;  // cut at kMaxName, as kernel names: the line stays within its buffer
  if (t.site) site = ",\"site\":\"" + json_escape(t.site, kMaxName) + "\"";
  const std::string s = ts(start), d = ts(base_ + (end - start));
  line("{\"name\":\"%s (%s)\",\"cat\":\"spillway\",\"ph\":\"X\",\"pid\":%u,\"tid\":%" PRIu64
       ",\"ts\":%s,\"dur\":%s,\"args\":{\"block\":\"%s\",\"bytes\":%" PRIu64
       ",\"cause\":\"%s\",\"clock\":\"%s\"%s%s%s}}",
       t.to_host ? "evict" : "restore", cause_name(t.cause), pid, tid, s.c_str(), d.c_str(), block,
       t.bytes, cause_name(t.cause), r ? "device" : "host", corr, for_corr, site.c_str());
  std::lock_guard lk(counters_mu_);
  (t.to_host ? c_.evictions : c_.restores) += 1;
  (t.to_host ? c_.bytes_evicted : c_.bytes_restored) += t.bytes;
  (r ? c_.transfers_device_clock : c_.transfers_host_clock) += 1;
}

void ChromeTrace::emit_uncommitted(const cupti::DeviceRecord& r, uint64_t) {
  // A copy spillway queued but did not commit (an eviction cancelled because
  // the block was used meanwhile, or rolled back): it took link time.
  ensure_track(r.device, kTidEvict);
  const std::string s = ts(r.start), d = ts(base_ + (std::max(r.end, r.start) - r.start));
  line(
      "{\"name\":\"copy not "
      "committed\",\"cat\":\"spillway\",\"ph\":\"X\",\"pid\":%u,\"tid\":%" PRIu64
      ",\"ts\":%s,\"dur\":%s,\"args\":{\"bytes\":%" PRIu64
      ",\"clock\":\"device\",\"correlation\":%u}}",
      r.device, kTidEvict, s.c_str(), d.c_str(), r.bytes, r.correlation);
  std::lock_guard lk(counters_mu_);
  ++c_.uncommitted_copies;
}

void ChromeTrace::emit_record(const cupti::DeviceRecord& r) {
  ensure_track(r.device, r.stream);
  const std::string s = ts(r.start), d = ts(base_ + (std::max(r.end, r.start) - r.start));
  switch (r.kind) {
    case cupti::DeviceRecord::Kind::kKernel: {
      const std::string name = json_escape(r.name ? r.name : "kernel", kMaxName);
      line(
          "{\"name\":\"%s\",\"cat\":\"kernel\",\"ph\":\"X\",\"pid\":%u,\"tid\":%u,\"ts\":%s,"
          "\"dur\":%s,\"args\":{\"correlation\":%u,\"grid\":[%d,%d,%d],\"block\":[%d,%d,%d],"
          "\"clock\":\"device\"}}",
          name.c_str(), r.device, r.stream, s.c_str(), d.c_str(), r.correlation, r.grid[0],
          r.grid[1], r.grid[2], r.block[0], r.block[1], r.block[2]);
      std::lock_guard lk(counters_mu_);
      ++c_.kernels;
      break;
    }
    case cupti::DeviceRecord::Kind::kMemcpy: {
      line(
          "{\"name\":\"memcpy %s\",\"cat\":\"memcpy\",\"ph\":\"X\",\"pid\":%u,\"tid\":%u,"
          "\"ts\":%s,\"dur\":%s,\"args\":{\"bytes\":%" PRIu64
          ",\"correlation\":%u,\"clock\":\"device\"}}",
          copy_kind_name(r.copy_kind), r.device, r.stream, s.c_str(), d.c_str(), r.bytes,
          r.correlation);
      std::lock_guard lk(counters_mu_);
      ++c_.memcpys;
      break;
    }
    case cupti::DeviceRecord::Kind::kMemset: {
      line(
          "{\"name\":\"memset\",\"cat\":\"memset\",\"ph\":\"X\",\"pid\":%u,\"tid\":%u,"
          "\"ts\":%s,\"dur\":%s,\"args\":{\"bytes\":%" PRIu64
          ",\"value\":%u,\"correlation\":%u,\"clock\":\"device\"}}",
          r.device, r.stream, s.c_str(), d.c_str(), r.bytes, r.value, r.correlation);
      std::lock_guard lk(counters_mu_);
      ++c_.memsets;
      break;
    }
  }
}

void ChromeTrace::note_join() {
  const size_t peak = join_->note();
  std::lock_guard lk(counters_mu_);
  c_.join_peak = peak;
}

void ChromeTrace::on_host_event(const HostEvent& e) {
  Join& j = *join_;
  switch (e.kind) {
    case HostEvent::Kind::kInternalCopy: {
      // The latest copy from this address on this stream is the one a
      // transfer will report; an older one never committed.
      auto it = std::find_if(j.copies.begin(), j.copies.end(), [&](const Join::Copy& c) {
        return c.src == e.ptr && c.stream == e.a;
      });
      if (it == j.copies.end()) {
        if (j.copies.size() == j.cap) j.copies.erase(j.copies.begin() + j.oldest(j.copies));
        j.copies.push_back({});
        it = j.copies.end() - 1;
      }
      *it = {e.ptr, e.a, ++j.seq, e.correlation};
      note_join();
      return;
    }
    case HostEvent::Kind::kTransfer: {
      Join::Waiting w{e, {}, {}, 0};
      const uint64_t end = e.ptr + std::max<uint64_t>(e.span, 1);
      for (auto it = j.copies.begin(); it != j.copies.end();) {
        if (it->stream != e.a || it->src < e.ptr || it->src >= end) {
          ++it;
          continue;
        }
        const uint32_t corr = it->correlation;
        it = j.copies.erase(it);
        auto rec = std::find_if(j.records.begin(), j.records.end(),
                                [&](const Join::Record& r) { return r.r.correlation == corr; });
        if (rec == j.records.end()) {
          w.correlations.push_back(corr);
          continue;
        }
        merge_record(w.done, rec->r);
        j.records.erase(rec);
      }
      if (w.correlations.empty())  // all in, or no activity: the host clock
        return emit_transfer(e, w.done.bytes ? &w.done : nullptr);
      if (j.waiting.size() == j.cap) {
        const size_t o = j.oldest(j.waiting);
        emit_transfer(j.waiting[o].t, nullptr);
        j.waiting.erase(j.waiting.begin() + o);
      }
      w.seq = ++j.seq;
      j.waiting.push_back(std::move(w));
      note_join();
      return;
    }
    case HostEvent::Kind::kMemory: {
      ensure_track(static_cast<uint32_t>(e.device), kTidEvict);
      const std::string t = ts(e.at);
      line(
          "{\"name\":\"spillway memory\",\"ph\":\"C\",\"pid\":%d,\"ts\":%s,\"args\":{"
          "\"resident_bytes\":%" PRIu64 ",\"host_bytes\":%" PRIu64 ",\"budget_bytes\":%" PRIu64
          "}}",
          e.device, t.c_str(), e.a, e.b, e.c);
      std::lock_guard lk(counters_mu_);
      ++c_.memory_samples;
      return;
    }
    case HostEvent::Kind::kOom: {
      ensure_track(static_cast<uint32_t>(e.device), kTidEvict);
      const std::string t = ts(e.at);
      line(
          "{\"name\":\"OOM avoided\",\"cat\":\"spillway\",\"ph\":\"i\",\"s\":\"t\",\"pid\":%d,"
          "\"tid\":%" PRIu64 ",\"ts\":%s,\"args\":{\"need_bytes\":%" PRIu64
          ",\"freed_bytes\":%" PRIu64 ",\"clock\":\"host\"}}",
          e.device, kTidEvict, t.c_str(), e.a, e.b);
      std::lock_guard lk(counters_mu_);
      ++c_.ooms_avoided;
      return;
    }
  }
}

void ChromeTrace::on_record(const cupti::DeviceRecord& r) {
  Join& j = *join_;
  if (r.kind == cupti::DeviceRecord::Kind::kMemcpy) {
    for (auto w = j.waiting.begin(); w != j.waiting.end(); ++w) {
      auto c = std::find(w->correlations.begin(), w->correlations.end(), r.correlation);
      if (c == w->correlations.end()) continue;
      w->correlations.erase(c);
      merge_record(w->done, r);
      if (!w->correlations.empty()) return;
      const HostEvent t = w->t;
      const cupti::DeviceRecord done = w->done;
      j.waiting.erase(w);
      return emit_transfer(t, &done);
    }
    auto c = std::find_if(j.copies.begin(), j.copies.end(),
                          [&](const Join::Copy& x) { return x.correlation == r.correlation; });
    if (c != j.copies.end()) {
      // spillway's copy, its transfer not reported yet (or never: cancelled).
      if (j.records.size() == j.cap) {
        const size_t o = j.oldest(j.records);
        emit_uncommitted(j.records[o].r, j.records[o].stream);
        j.records.erase(j.records.begin() + o);
      }
      j.records.push_back({r, c->stream, ++j.seq});
      note_join();
      return;
    }
    // A copy of spillway's whose block was copied again since: never committed.
  }
  emit_record(r);
}

void ChromeTrace::take_events() {
  size_t n = 0;
  spill_batch_.clear();
  {
    std::lock_guard lk(ring_mu_);
    n = ring_count_;
    for (size_t i = 0; i < n; ++i) batch_[i] = ring_[(ring_head_ + i) % limits_.ring_events];
    ring_head_ = (ring_head_ + n) % limits_.ring_events;
    ring_count_ = 0;
    spill_batch_.swap(spill_);
  }
  for (size_t i = 0; i < n; ++i) on_host_event(batch_[i]);
  for (const HostEvent& e : spill_batch_) on_host_event(e);
}

void ChromeTrace::on_records(std::span<const cupti::DeviceRecord> records) {
  std::lock_guard lk(write_mu_);
  if (out_->closed()) return;
  // These records' buffers completed before the ring is read now: every
  // copy of spillway's they hold was announced (at the call) before it ran,
  // so its event is handled before its record.
  take_events();
  for (const cupti::DeviceRecord& r : records) on_record(r);
  write_out();
}

void ChromeTrace::run() {
  const uint64_t sig = sig_requests_.load(std::memory_order_acquire);
  const bool signalled = sig != sig_done_.load(std::memory_order_acquire);
  // Not under write_mu_: the reader's listeners take it.
  if (signalled && activity_) activity_->sync(std::chrono::milliseconds(kSignalSyncMs));
  std::lock_guard lk(write_mu_);
  if (!out_->closed()) {
    take_events();
    write_out();
  }
  if (signalled) {
    if (sig_fatal_.load(std::memory_order_acquire) && !out_->closed()) {
      close_file();
      closed_.store(true, std::memory_order_release);
    }
    sig_done_.store(sig, std::memory_order_release);
  }
}

void ChromeTrace::close_file() {
  {
    std::lock_guard lk(ring_mu_);
    accepting_ = false;
  }
  take_events();
  // Whatever is still unmatched goes out as it is.
  Join& j = *join_;
  for (const auto& w : j.waiting) emit_transfer(w.t, nullptr);
  j.waiting.clear();
  for (const auto& r : j.records) emit_uncommitted(r.r, r.stream);
  j.records.clear();
  if (activity_) {
    std::lock_guard lk(counters_mu_);
    c_.records_dropped = activity_->dropped();
    c_.buffers_cut = activity_->cut_buffers();
    c_.activity_buffers_peak = activity_->peak_in_use();
  }
  const Counters c = counters();
  const std::string t = ts(std::max(now(), start_trace_ns_));
  line(
      "{\"name\":\"spillway trace end\",\"ph\":\"i\",\"s\":\"g\",\"pid\":0,\"tid\":0,\"ts\":%s,"
      "\"args\":{\"kernels\":%" PRIu64 ",\"memcpys\":%" PRIu64 ",\"memsets\":%" PRIu64
      ",\"evictions\":%" PRIu64 ",\"restores\":%" PRIu64 ",\"bytes_evicted\":%" PRIu64
      ",\"bytes_restored\":%" PRIu64 ",\"transfers_device_clock\":%" PRIu64
      ",\"transfers_host_clock\":%" PRIu64 ",\"uncommitted_copies\":%" PRIu64
      ",\"memory_samples\":%" PRIu64 ",\"ooms_avoided\":%" PRIu64 ",\"events_dropped\":%" PRIu64
      ",\"records_dropped\":%" PRIu64 ",\"buffers_cut\":%" PRIu64 ",\"clamped_timestamps\":%" PRIu64
      ",\"ring_peak\":%zu,\"ring_cap\":%zu,\"out_peak_bytes\":%zu,\"out_cap_bytes\":%zu,"
      "\"join_peak\":%zu,\"join_cap\":%zu,\"activity_buffers_peak\":%zu,"
      "\"activity_buffers\":%zu,\"activity_buffer_bytes\":%zu}}",
      t.c_str(), c.kernels, c.memcpys, c.memsets, c.evictions, c.restores, c.bytes_evicted,
      c.bytes_restored, c.transfers_device_clock, c.transfers_host_clock, c.uncommitted_copies,
      c.memory_samples, c.ooms_avoided, c.events_dropped, c.records_dropped, c.buffers_cut,
      c.clamped, c.ring_peak, c.ring_cap, c.out_peak, c.out_cap, c.join_peak, c.join_cap,
      c.activity_buffers_peak, c.activity_buffers, cupti::ActivityBuffers::kBufferBytes);
  out_->close();
  std::lock_guard lk(counters_mu_);
  c_.out_peak = out_->buffered_peak();
  c_.bytes_written = out_->bytes_written();
  c_.closed = true;
}

void ChromeTrace::finish() {
  if (getpid() != owner_pid_) return;  // a fork's copy: the parent owns the file
  std::lock_guard lk(finish_mu_);
  if (finished_) return;
  finished_ = true;
  stop_.store(true, std::memory_order_release);
  // Normally the reader was stopped first (its last records are in); if not,
  // what it has is handed over before the file closes.
  if (activity_) activity_->sync(std::chrono::milliseconds(kSignalWaitMs));
  writer_->stop();
  std::lock_guard write(write_mu_);
  if (!out_->closed()) close_file();
  closed_.store(true, std::memory_order_release);
}

void ChromeTrace::signal_flush(bool fatal) {
  // Async-signal-safe: lock-free atomics and nanosleep only (no wake-up: it
  // takes a mutex the interrupted thread may hold; the writer sees the
  // request within flush_ms). The writer thread does the work (it blocks
  // these signals); this waits for it a bounded time, so a writer stuck
  // behind a lock the interrupted thread holds cannot hang the process: the
  // file then ends at its last write.
  if (getpid() != owner_pid_ || closed_.load(std::memory_order_acquire) ||
      stop_.load(std::memory_order_acquire))
    return;
  if (fatal) sig_fatal_.store(true, std::memory_order_release);
  const uint64_t ticket = sig_requests_.fetch_add(1, std::memory_order_acq_rel) + 1;
  const timespec ms{0, 1000000};
  for (int i = 0; i < kSignalWaitMs; ++i) {
    if (sig_done_.load(std::memory_order_acquire) >= ticket) return;
    nanosleep(&ms, nullptr);
  }
}

void ChromeTrace::install_signal_handlers() {
  ChromeTrace* expected = nullptr;
  if (g_signal_trace.compare_exchange_strong(expected, this)) term_signals::add(&on_term_signal);
}

ChromeTrace::Counters ChromeTrace::counters() const {
  Counters c;
  {
    std::lock_guard lk(counters_mu_);
    c = c_;
  }
  std::lock_guard lk(ring_mu_);
  c.events_dropped = dropped_;
  c.events_late = late_;
  c.ring_peak = ring_peak_;
  c.spill_peak = spill_peak_;
  return c;
}

std::string ChromeTrace::describe() const {
  const Counters c = counters();
  char buf[768];
  std::snprintf(buf, sizeof buf,
                "trace %s: %" PRIu64 " kernels, %" PRIu64 " memcpys, %" PRIu64 " memsets, %" PRIu64
                " evictions (%" PRIu64 " bytes), %" PRIu64 " restores (%" PRIu64 " bytes), %" PRIu64
                " on the device clock and %" PRIu64 " on the host clock, %" PRIu64
                " memory samples, %" PRIu64 " OOMs avoided%s%s",
                path_.c_str(), c.kernels, c.memcpys, c.memsets, c.evictions, c.bytes_evicted,
                c.restores, c.bytes_restored, c.transfers_device_clock, c.transfers_host_clock,
                c.memory_samples, c.ooms_avoided,
                simulated_    ? "; times are simulated"
                : sim_driver_ ? "; times are host time over a simulated GPU"
                              : "",
                c.events_dropped || c.records_dropped || c.buffers_cut
                    ? "; some events were dropped (see the end event)"
                    : "");
  return buf;
}

}  // namespace spillway
