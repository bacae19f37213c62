#include "recorder.h"

#include <algorithm>

#include "log.h"

namespace spillway {

std::unique_ptr<Recorder> Recorder::open(const std::string& path, std::string* why) {
  std::unique_ptr<Recorder> r(new Recorder);
  r->path_ = path;
  if (!r->w_.open(path, R"({"source":"shim","format":"spwt"})")) {
    *why = r->w_.error();
    return nullptr;
  }
  // Stream 0 is the legacy default stream (docs/trace-format.md).
  r->streams_[nullptr] = 0;
  // The job starts in step 0; spillway_mark_step ends a step (the shim
  // cannot see set-up apart from the first step).
  if (!r->w_.step(0)) {
    *why = r->w_.error();
    return nullptr;
  }
  return r;
}

Recorder::~Recorder() {
  close();
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

void Recorder::on_alloc(const void* p, size_t size, CUstream stream, const char* site) {
  std::lock_guard lk(mu_);
  if (broken_ || !p) return;
  flush_launch();
  const uint64_t id = next_alloc_++;
  live_[reinterpret_cast<uintptr_t>(p)] = {id, size};
  const uint64_t site_id = site ? string_id(site) : 0;
  if (!w_.alloc(id, size, stream_id(stream), site_id)) failed();
}

void Recorder::on_free(const void* p, size_t size, CUstream stream) {
  std::lock_guard lk(mu_);
  if (broken_) return;
  auto it = live_.find(reinterpret_cast<uintptr_t>(p));
  // A bad free (unknown pointer, wrong size) is refused by the allocator.
  if (it == live_.end() || it->second.size != size) return;
  flush_launch();
  if (!w_.free(it->second.id, stream_id(stream))) failed();
  live_.erase(it);
}

void Recorder::on_access(const Access& a, const Touch* touches, size_t n) {
  std::lock_guard lk(mu_);
  if (broken_) return;
  if (!pending_ || a.seq != pending_seq_) {
    flush_launch();
    pending_ = true;
    pending_seq_ = a.seq;
    pending_stream_ = stream_id(a.stream);
    const char* name = a.name;
    if (!name) {
      switch (a.kind) {
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
    pending_correlation_ = a.correlation;
    pending_touches_.clear();
  }
  for (size_t i = 0; i < n; ++i) {
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

void Recorder::on_step(uint64_t step) {
  std::lock_guard lk(mu_);
  if (broken_) return;
  flush_launch();
  if (!w_.step(step)) failed();
}

void Recorder::on_kernel_time(uint32_t correlation, uint64_t duration_ns) {
  std::lock_guard lk(mu_);
  if (broken_) return;
  if (pending_ && pending_correlation_ == correlation) flush_launch();
  auto it = awaiting_.find(correlation);
  if (it == awaiting_.end()) return;
  if (!w_.duration(it->second, duration_ns)) failed();
  awaiting_.erase(it);
}

void Recorder::on_device_record(void* self, const cupti::DeviceRecord& r) {
  if (r.kind == cupti::DeviceRecord::Kind::kKernel && r.end >= r.start)
    static_cast<Recorder*>(self)->on_kernel_time(r.correlation, r.end - r.start);
}

bool Recorder::collect_durations(const cupti::Api& api, std::string* why) {
  activity_ = cupti::ActivityBuffers::start(
      api,
      [](void* self) {
        auto* r = static_cast<Recorder*>(self);
        std::lock_guard lk(r->wake_mu_);
        r->wake_ = true;
        r->wake_cv_.notify_one();
      },
      this, why);
  if (!activity_) return false;
  drainer_ = std::thread([this] { drain_loop(); });
  return true;
}

void Recorder::drain_loop() {
  std::unique_lock lk(wake_mu_);
  while (!stop_) {
    const bool woken =
        wake_cv_.wait_for(lk, std::chrono::milliseconds(200), [&] { return wake_ || stop_; });
    wake_ = false;
    lk.unlock();
    // Buffers complete when full (the wake) or when flushed: flush now and
    // then so that a slow job's durations do not wait for its end. Not under
    // wake_mu_: the flush hands buffers back through the wake callback,
    // which takes it.
    if (!woken) activity_->flush();
    activity_->drain([&](const cupti::DeviceRecord& r) { on_device_record(this, r); });
    lk.lock();
  }
}

void Recorder::close() {
  if (drainer_.joinable()) {
    {
      std::lock_guard lk(wake_mu_);
      stop_ = true;
    }
    wake_cv_.notify_one();
    drainer_.join();
    activity_->flush();
    activity_->drain([&](const cupti::DeviceRecord& r) { on_device_record(this, r); });
  }
  std::lock_guard lk(mu_);
  if (!w_.is_open()) return;
  flush_launch();
  if (!broken_ && !w_.close()) failed();
  if (!broken_) log::info("SPILLWAY_RECORD: {} records written to {}", w_.records(), path_);
}

uint64_t Recorder::records() const {
  std::lock_guard lk(mu_);
  return w_.records();
}

}  // namespace spillway
