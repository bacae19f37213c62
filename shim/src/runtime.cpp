#include "runtime.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "log.h"
#include "output_file.h"

extern char** environ;

namespace spillway {
namespace {

std::atomic<Runtime*> g_runtime{nullptr};
// How long a fatal signal's handler waits for the report (the files): a
// finisher stuck behind a lock the interrupted thread holds costs the files'
// last writes, not a hang.
constexpr int kSignalWaitMs = 3000;

// The memory this process may use: physical memory, or less under a cgroup
// limit (a container), which is what pinned host memory must fit in.
uint64_t host_memory_bytes() {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  uint64_t total =
      pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    if (std::FILE* f = std::fopen(path, "r")) {
      unsigned long long limit = 0;
      if (std::fscanf(f, "%llu", &limit) == 1 && limit > 0 && limit < total) total = limit;
      std::fclose(f);
    }
  }
  return total;
}

}  // namespace

Runtime& Runtime::get() {
  static Runtime* rt = [] {
    auto* r = new Runtime;
    r->start();
    g_runtime.store(r, std::memory_order_release);
    return r;
  }();
  return *rt;
}

Runtime* Runtime::peek() {
  return g_runtime.load(std::memory_order_acquire);
}

void Runtime::start() {
  std::string error;
  auto cfg = parse_config(environ, &error);
  if (!cfg) {
    // Contract 4: bad configuration is refused at start, naming the variable.
    std::fprintf(stderr, "%s\n", error.c_str());
    std::fflush(stderr);
    std::_Exit(2);
  }
  cfg_ = *cfg;
  std::string why;
  if (!log::init(cfg_.log_level, cfg_.log_file, &why, log_tag(environ)))
    log::warn("cannot open SPILLWAY_LOG_FILE '{}' ({}); logging to stderr", cfg_.log_file, why);
  driver_ = cu::load(&why);
  if (!driver_) {
    log::error("no usable CUDA driver ({}): every allocation will fail", why);
  } else if (CUresult r = driver_->cuInit(0); r != CUDA_SUCCESS) {
    log::error("cuInit failed: {}", cu::describe(*driver_, r));
    driver_ = nullptr;
  }
  // Opened now, so that a path that cannot be written is said at the start,
  // not after the job.
  if (!cfg_.stats_file.empty() && (stats_fd_ = open_output(cfg_.stats_file, &why)) < 0)
    log::warn("cannot write SPILLWAY_STATS file '{}' ({}): no statistics file", cfg_.stats_file,
              why);
  if (!cfg_.record_file.empty()) {
    recorder_ = Recorder::open(cfg_.record_file, &why);
    if (!recorder_)
      log::warn("cannot write SPILLWAY_RECORD file '{}' ({}): not recording", cfg_.record_file,
                why);
  }
  if (driver_ && cfg_.mode != Mode::kOff) start_tracking();
  start_observers();
  // After the trace's own hook (start_observers): a SIGTERM that ends the
  // process first has the trace written out, then everything else reported
  // as at exit (docs/profiling.md, "When the job ends").
  pid_ = static_cast<int>(getpid());
  if (stats_fd_ >= 0 || recorder_ || trace_) {
    finisher_ = std::make_unique<term_signals::Finisher>([this] { report_at_exit(); });
    term_signals::add(&Runtime::on_term_signal);
  }
  std::atexit([] {
    if (Runtime* rt = peek()) rt->report_at_exit();
  });
}

void Runtime::start_tracking() {
  std::string why;
  if (!cfg_.cupti) {
    why = "SPILLWAY_CUPTI=off";
  } else if (const cupti::Api* api = cupti::load(cfg_.cupti_path, &why)) {
    tracker_ = Tracker::start(*api, *driver_, *this, &why);
  }
  if (tracker_) return;
  // Contract 4: a safer mode, one clear warning. Evicted blocks stay mapped
  // at their addresses, so unseen reads are slow but correct.
  blind_ = true;
  log::warn(
      "running without access tracking ({}): evicted blocks are {} until restored, and "
      "eviction ahead of need is off",
      why,
      cfg_.mode == Mode::kManaged ? "faulted back to the GPU page by page" : "read over the link");
}

void Runtime::start_observers() {
  std::string why;
  // Device timestamps, kernels and kernel durations come from CUPTI's
  // activity records: one reader per process, which needs the tracker's CUPTI.
  std::string no_activity = "no access tracking";
  plan_ = tracker_ && cfg_.plan && cfg_.mode == Mode::kHost;
  if (tracker_ && (!cfg_.trace_file.empty() || recorder_)) {
    if (const cupti::Api* api = cupti::load(cfg_.cupti_path, &no_activity))
      activity_ = cupti::ActivityReader::open(*api, &no_activity);
  }
  if (!cfg_.trace_file.empty()) {
    trace_ = ChromeTrace::open(cfg_.trace_file, activity_.get(), &why);
    if (!trace_) {
      log::warn("cannot write SPILLWAY_TRACE file '{}' ({}): no trace", cfg_.trace_file, why);
    } else {
      // Spillway's events still go out, on the host clock.
      if (tracker_ && !activity_)
        log::warn("SPILLWAY_TRACE: no device timestamps ({}): kernels are missing", no_activity);
      if (activity_) activity_->listen(trace_.get());
      trace_->install_signal_handlers();
    }
  }
  if (recorder_) {
    if (activity_)
      activity_->listen(recorder_.get());
    else
      log::warn("SPILLWAY_RECORD: kernel durations are not recorded ({})", no_activity);
  }
  // The step plans' launch durations: from the reader the trace or the
  // record starts, else from one started once a budget is crossed (a job
  // that fits pays for no activity records; start_launch_records).
  if (plan_ && activity_) {
    launch_records_ = std::make_unique<LaunchRecords>(*this);
    activity_->listen(launch_records_.get());
    plan_reader_.store(activity_.get(), std::memory_order_release);
  }
  if (activity_) {
    if (activity_->has_listeners())
      activity_->start();
    else
      activity_.reset();
  }
  if (cfg_.stacks) {
    sites_ = Sites::start(cfg_.min_block, &why);
    if (!sites_) log::warn("SPILLWAY_STACKS=1: {}; allocation sites are not recorded", why);
  }
  // Sites first: it names the blocks' sites for the others.
  observers_.add(sites_.get());
  observers_.add(trace_.get());
  observers_.add(recorder_.get());
  if (tracker_ && !observers_.empty())
    tracker_->set_internal_call_hook(&Observers::internal_call, &observers_);
}

void Runtime::envelope(uintptr_t* lo, uintptr_t* hi) const {
  *lo = UINTPTR_MAX;
  *hi = 0;
  const size_t n = active_count_.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i) {
    Allocator* a = active_[i].load(std::memory_order_acquire);
    if (!a) continue;
    uintptr_t l = 0, h = 0;
    a->envelope(&l, &h);
    *lo = std::min(*lo, l);
    *hi = std::max(*hi, h);
  }
  if (*lo > *hi) *lo = *hi = 0;
}

bool Runtime::may_own(uintptr_t p) const {
  const size_t n = active_count_.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i) {
    Allocator* a = active_[i].load(std::memory_order_acquire);
    if (a && a->may_own(p)) return true;
  }
  return false;
}

template <class F>
void Runtime::for_each_owner(const Touch* touches, size_t n, F&& f) {
  // Each allocator gets all the ranges of a call at once: a launch's blocks
  // are one unit, held together while any of them is restored, under one
  // taking of the allocator's lock. One device (the norm: a process per
  // GPU): all of them, as they are (an allocator ignores ranges it does not
  // own). Several: each its own, gathered in a buffer reused per thread.
  const size_t count = active_count_.load(std::memory_order_acquire);
  if (count == 1) {
    if (Allocator* a = active_[0].load(std::memory_order_acquire)) f(*a, touches, n);
    return;
  }
  thread_local std::vector<Touch> mine;
  for (size_t i = 0; i < count; ++i) {
    Allocator* a = active_[i].load(std::memory_order_acquire);
    if (!a) continue;
    mine.clear();
    for (size_t t = 0; t < n; ++t)
      if (a->may_own(touches[t].lo)) mine.push_back(touches[t]);
    if (!mine.empty()) f(*a, mine.data(), mine.size());
  }
}

bool Runtime::before_use(const Access& access, const Touch* touches, size_t n) {
  bool held = false;
  for_each_owner(touches, n, [&](Allocator& a, const Touch* t, size_t m) {
    held = a.before_use(access, t, m) || held;
  });
  if (!observers_.empty()) observers_.on_access(access, touches, n);
  return held;
}

void Runtime::hold(const Touch* touches, size_t n) {
  for_each_owner(touches, n, [](Allocator& a, const Touch* t, size_t m) { a.hold(t, m); });
}

void Runtime::after_use(CUstream stream, const Touch* touches, size_t n) {
  for_each_owner(touches, n,
                 [&](Allocator& a, const Touch* t, size_t m) { a.after_use(stream, t, m); });
}

void Runtime::prefetch(const Touch* touches, size_t n) {
  for_each_owner(touches, n, [](Allocator& a, const Touch* t, size_t m) { a.prefetch(t, m); });
}

void Runtime::release(const Touch* touches, size_t n) {
  for_each_owner(touches, n, [](Allocator& a, const Touch* t, size_t m) { a.release(t, m); });
}

int Runtime::device_of(const void* ptr) {
  // A bad free's path only: every device's allocator, the lock-free table
  // holding the first kMaxDevices alone.
  std::vector<Allocator*> all;
  {
    std::lock_guard lk(mu_);
    for (const auto& a : allocators_) all.push_back(a.get());
  }
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i] && all[i]->is_live(ptr)) return static_cast<int>(i);
  return -1;
}

Allocator* Runtime::allocator(int device) {
  if (device < 0 || device > 1023) return nullptr;
  // Every malloc and free comes here: the common case takes no lock.
  if (static_cast<size_t>(device) < kMaxDevices)
    if (Allocator* a = active_[static_cast<size_t>(device)].load(std::memory_order_acquire))
      return a;
  std::lock_guard lk(mu_);
  const size_t i = static_cast<size_t>(device);
  if (i < allocators_.size() && allocators_[i]) return allocators_[i].get();
  if (i < failed_.size() && failed_[i]) return nullptr;
  if (allocators_.size() <= i) {
    allocators_.resize(i + 1);
    failed_.resize(i + 1, false);
  }
  if (!driver_) {
    failed_[i] = true;
    return nullptr;
  }
  CUdevice dev = 0;
  size_t total = 0;
  if (driver_->cuDeviceGet(&dev, device) != CUDA_SUCCESS ||
      driver_->cuDeviceTotalMem(&total, dev) != CUDA_SUCCESS) {
    log::error("device {} is not available", device);
    failed_[i] = true;
    return nullptr;
  }
  AllocatorOptions o;
  o.device = device;
  o.min_block = cfg_.min_block;
  o.evict = cfg_.mode != Mode::kOff;
  // Predictions need every launch's accesses.
  o.prefetch_launches = tracker_ ? cfg_.prefetch_launches : 0;
  o.plan = tracker_ && cfg_.plan;
  o.managed = cfg_.mode == Mode::kManaged;
  // Evicting ahead of need is safe only when every access is seen.
  o.background = tracker_ != nullptr;
  // Managed mode keeps least recent use: with the learned schedule's choices
  // the simulated device held up to 6 MiB more than spillway counted (and
  // crossed the budget in ReplayTest.ManagedModeCompletesAtFortyPercent),
  // a residency-accounting gap not yet found (docs/limitations.md).
  if (cfg_.policy == Policy::kLru || cfg_.mode == Mode::kManaged)
    o.chooser = std::make_shared<policy::LruChooser>();
  // Null when nobody observes: the allocator then skips the clock reads.
  o.observer = observers_.empty() ? nullptr : &observers_;
  o.gpu_budget = cfg_.mode == Mode::kOff ? 0
                 : cfg_.gpu_budget.set   ? cfg_.gpu_budget.resolve(total)
                                         : default_gpu_budget(total);
  const uint64_t host_total = host_memory_bytes();
  o.host_budget =
      cfg_.host_budget.set ? cfg_.host_budget.resolve(host_total) : default_host_budget(host_total);
  // Off unless asked for. On an H100 half the budget shortened the first
  // step over the budget and cost the others nothing (docs/gpu.md, runs
  // 11-14), but its thread's exit draws a ThreadSanitizer report not yet
  // understood (docs/config.md), so the default waits for that.
  o.host_reserve = cfg_.host_reserve.set ? cfg_.host_reserve.resolve(o.gpu_budget) : 0;
  std::string why;
  allocators_[i] = Allocator::create(*driver_, o, &why);
  if (!allocators_[i]) {
    log::error("cannot start the allocator for device {}: {}", device, why);
    failed_[i] = true;
    return nullptr;
  }
  log::debug("device {}: budget {} bytes of {}, host budget {} bytes", device, o.gpu_budget, total,
             o.host_budget);
  if (i < kMaxDevices) {
    active_[i].store(allocators_[i].get(), std::memory_order_release);
    size_t cur = active_count_.load();
    while (cur < i + 1 && !active_count_.compare_exchange_weak(cur, i + 1)) {
    }
  }
  return allocators_[i].get();
}

void Runtime::LaunchRecords::on_records(std::span<const cupti::DeviceRecord> records) {
  for (const cupti::DeviceRecord& r : records)
    if (r.device < kMaxDevices)
      if (Allocator* a = r_.active_[r.device].load(std::memory_order_acquire))
        a->on_launch_record(r.correlation, r.start, r.end);
}

void Runtime::start_launch_records() {
  std::lock_guard lk(mu_);
  if (launch_records_ || activity_ || plan_failed_) return;
  std::string why;
  const cupti::Api* api = cupti::load(cfg_.cupti_path, &why);
  std::unique_ptr<cupti::ActivityReader> reader =
      api ? cupti::ActivityReader::open(*api, &why) : nullptr;
  if (!reader) {
    plan_failed_ = true;
    log::warn("SPILLWAY_PLAN: no launch durations ({}): every launch is planned as equally long",
              why);
    return;
  }
  launch_records_ = std::make_unique<LaunchRecords>(*this);
  reader->listen(launch_records_.get());
  reader->start();
  activity_ = std::move(reader);
  plan_reader_.store(activity_.get(), std::memory_order_release);
}

void Runtime::mark_step() {
  const uint64_t next = steps_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (plan_) {
    // Only a job over its budget is planned: it alone needs the durations.
    bool crossed = false;
    for (size_t i = 0; i < active_count_.load(std::memory_order_acquire) && !crossed; ++i)
      if (Allocator* a = active_[i].load(std::memory_order_acquire)) crossed = a->crossed_budget();
    cupti::ActivityReader* reader = plan_reader_.load(std::memory_order_acquire);
    if (crossed && !reader) {
      start_launch_records();
      reader = plan_reader_.load(std::memory_order_acquire);
    }
    // The step's launch durations, as far as CUPTI has them, before the
    // plan for the next step is made from them (what is not delivered by
    // then counts from the step after).
    if (crossed && reader) reader->sync(std::chrono::milliseconds(20));
  }
  if (!observers_.empty()) observers_.on_step(next);
  // Where the step ends in the order of accesses: launches after it belong
  // to the next step, whether or not they touch a large block.
  const uint64_t end = tracker_ ? tracker_->last_seq() : own_seq_.load(std::memory_order_relaxed);
  const size_t n = active_count_.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i)
    if (Allocator* a = active_[i].load(std::memory_order_acquire)) a->mark_step(end);
}

uint64_t Runtime::next_access_seq() {
  return tracker_ ? tracker_->next_seq() : own_seq_.fetch_add(1, std::memory_order_relaxed) + 1;
}

Stats Runtime::stats() {
  Stats sum;
  sum.ooms = unserved_.load(std::memory_order_relaxed);
  sum.blind = blind_ ? 1 : 0;
  std::lock_guard lk(mu_);
  for (auto& a : allocators_) {
    if (!a) continue;
    // Devices are summed; a multi-device job reads per-device figures from
    // the per-rank files (one process per GPU is the norm).
    add_device(&sum, a->stats());
  }
  return sum;
}

void Runtime::reset_recent_peaks() {
  std::lock_guard lk(mu_);
  for (auto& a : allocators_)
    if (a) a->reset_recent_peaks();
}

void Runtime::report_at_exit() {
  // A second caller (the exit while a signal's finisher reports, or the
  // reverse) waits for the first to end.
  std::call_once(reported_, [this] { report(); });
}

void Runtime::on_term_signal(bool fatal) {
  // Async-signal-safe. A signal the job handles itself (`fatal` false) lets
  // it go on: its exit writes the files.
  Runtime* rt = peek();
  if (!fatal || !rt || !rt->finisher_ || getpid() != rt->pid_) return;
  rt->finisher_->request_and_wait(kSignalWaitMs);
}

void Runtime::report() {
  {
    // The allocators live on (PyTorch may free during shutdown), but their
    // background threads must not outlive the logger and the driver.
    std::lock_guard lk(mu_);
    for (auto& a : allocators_)
      if (a) a->stop_background();
  }
  Stats s = stats();
  // The one line a user always gets (unless SPILLWAY_LOG_LEVEL=off), even at
  // a quieter level than info.
  // The reader first: its last records bring the trace's kernels and the
  // record's durations.
  cupti::ActivityReader* activity = nullptr;
  {
    std::lock_guard lk(mu_);  // start_launch_records may have made it meanwhile
    activity = activity_.get();
  }
  if (activity) activity->stop();
  if (trace_) trace_->finish();
  if (recorder_) recorder_->close();
  auto& l = log::get();
  if (cfg_.log_level != LogLevel::kOff) {
    l.log(std::max(l.level(), spdlog::level::info), "{}", summary_line(s));
    if (trace_) l.log(std::max(l.level(), spdlog::level::info), "{}", trace_->describe());
    if (sites_) {
      const std::string top = sites_->top(5);
      if (!top.empty())
        l.log(std::max(l.level(), spdlog::level::info),
              "allocation sites whose blocks were evicted most (SPILLWAY_STACKS):\n{}", top);
    }
  }
  if (stats_fd_ >= 0) {
    const int fd = std::exchange(stats_fd_, -1);
    std::FILE* f = fdopen(fd, "w");
    if (!f) {
      close(fd);
      log::error("cannot write SPILLWAY_STATS file '{}'", cfg_.stats_file);
      return;
    }
    std::string json = to_json(s, steps());
    std::fputs(json.c_str(), f);
    std::fputc('\n', f);
    std::fclose(f);
  }
  log::get().flush();
}

}  // namespace spillway
