#include "activity.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "clock.h"

namespace spillway::cupti {
namespace {

// CUPTI's buffer callbacks carry no user pointer: the one instance.
std::atomic<ActivityBuffers*> g_instance{nullptr};

constexpr CUpti_ActivityKind kKinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    CUPTI_ACTIVITY_KIND_MEMCPY,
    CUPTI_ACTIVITY_KIND_MEMSET,
};

}  // namespace

ActivityBuffers::ActivityBuffers(const Api& api, void (*wake)(void*), void* ctx)
    : api_(api),
      wake_(wake),
      wake_ctx_(ctx),
      // new[] of uint8_t is aligned for any fundamental type (8 bytes at
      // least: ACTIVITY_RECORD_ALIGNMENT), and kBufferBytes is a multiple of 8.
      storage_(new uint8_t[kBuffers * kBufferBytes]) {
  static_assert(kBufferBytes % ACTIVITY_RECORD_ALIGNMENT == 0);
  for (size_t i = 0; i < kBuffers; ++i) free_[i] = kBuffers - 1 - i;
  free_count_ = kBuffers;
}

std::unique_ptr<ActivityBuffers> ActivityBuffers::start(const Api& api, void (*wake)(void*),
                                                        void* ctx, std::string* why) {
  auto text = [&](CUptiResult e) {
    const char* s = nullptr;
    api.cuptiGetResultString(e, &s);
    return std::string(s ? s : "unknown CUPTI error");
  };
  ActivityBuffers* expected = nullptr;
  std::unique_ptr<ActivityBuffers> b(new ActivityBuffers(api, wake, ctx));
  if (!g_instance.compare_exchange_strong(expected, b.get())) {
    *why = "the activity buffers are already in use";
    b.reset();  // the destructor leaves the other instance alone
    return nullptr;
  }
  if (CUptiResult r = api.cuptiActivityRegisterCallbacks(&on_request, &on_complete);
      r != CUPTI_SUCCESS) {
    *why = "cuptiActivityRegisterCallbacks failed: " + text(r);
    return nullptr;
  }
  for (CUpti_ActivityKind k : kKinds) {
    if (CUptiResult r = api.cuptiActivityEnable(k); r != CUPTI_SUCCESS) {
      *why = "cuptiActivityEnable(" + std::to_string(static_cast<int>(k)) + ") failed: " + text(r);
      return nullptr;
    }
  }
  return b;
}

ActivityBuffers::~ActivityBuffers() {
  if (g_instance.load(std::memory_order_acquire) != this) return;
  for (CUpti_ActivityKind k : kKinds) api_.cuptiActivityDisable(k);
  // Get back what CUPTI holds before the storage goes.
  api_.cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  g_instance.store(nullptr, std::memory_order_release);
  std::lock_guard lk(mu_);
  // A buffer CUPTI still holds (it may keep a spare) could be written to
  // later: leave the storage to it rather than free memory in use.
  if (free_count_ + completed_count_ != kBuffers) (void)storage_.release();
}

void CUPTIAPI ActivityBuffers::on_request(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = nullptr;
  *size = 0;
  *max_records = 0;  // as many as fit
  if (ActivityBuffers* b = g_instance.load(std::memory_order_acquire)) b->request(buffer, size);
}

void CUPTIAPI ActivityBuffers::on_complete(CUcontext, uint32_t, uint8_t* buffer, size_t,
                                           size_t valid) {
  if (ActivityBuffers* b = g_instance.load(std::memory_order_acquire)) b->complete(buffer, valid);
}

void ActivityBuffers::request(uint8_t** buffer, size_t* size) {
  std::unique_lock lk(mu_);
  if (free_count_ == 0) {
    // Every buffer is full and waiting for the consumer: wake it and wait a
    // little rather than lose records, but never indefinitely (the caller
    // may be a driver thread).
    lk.unlock();
    wake_(wake_ctx_);
    lk.lock();
    returned_.wait_for(lk, std::chrono::milliseconds(kRequestWaitMs),
                       [&] { return free_count_ > 0; });
    if (free_count_ == 0) return;  // CUPTI drops the record and counts it
  }
  const size_t i = free_[--free_count_];
  const size_t in_use = kBuffers - free_count_;
  if (in_use > peak_in_use_.load(std::memory_order_relaxed))
    peak_in_use_.store(in_use, std::memory_order_relaxed);
  *buffer = storage_.get() + i * kBufferBytes;
  *size = kBufferBytes;
}

void ActivityBuffers::complete(uint8_t* buffer, size_t valid) {
  const auto offset = static_cast<size_t>(buffer - storage_.get());
  if (buffer < storage_.get() || offset >= kBuffers * kBufferBytes) return;  // not ours
  {
    std::lock_guard lk(mu_);
    completed_[completed_count_++] = {offset / kBufferBytes, valid};
  }
  wake_(wake_ctx_);
}

size_t ActivityBuffers::take_completed(std::array<std::pair<size_t, size_t>, kBuffers>& out) {
  std::lock_guard lk(mu_);
  const size_t n = completed_count_;
  std::copy_n(completed_.begin(), n, out.begin());
  completed_count_ = 0;
  return n;
}

void ActivityBuffers::recycle(size_t index) {
  {
    std::lock_guard lk(mu_);
    free_[free_count_++] = index;
  }
  returned_.notify_all();
}

void ActivityBuffers::flush() {
  api_.cuptiActivityFlushAll(0);
}

uint64_t ActivityBuffers::dropped() {
  size_t n = 0;
  if (api_.cuptiActivityGetNumDroppedRecords(nullptr, 0, &n) == CUPTI_SUCCESS) dropped_ += n;
  return dropped_;
}

bool ActivityBuffers::decode(const CUpti_Activity* r, DeviceRecord* d) {
  switch (r->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
      d->kind = DeviceRecord::Kind::kKernel;
      d->device = k->deviceId;
      d->stream = k->streamId;
      d->correlation = k->correlationId;
      d->start = k->start;
      d->end = k->end;
      d->name = k->name;
      d->grid[0] = k->gridX;
      d->grid[1] = k->gridY;
      d->grid[2] = k->gridZ;
      d->block[0] = k->blockX;
      d->block[1] = k->blockY;
      d->block[2] = k->blockZ;
      return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
      d->kind = DeviceRecord::Kind::kMemcpy;
      d->copy_kind = m->copyKind;
      d->device = m->deviceId;
      d->stream = m->streamId;
      d->correlation = m->correlationId;
      d->start = m->start;
      d->end = m->end;
      d->bytes = m->bytes;
      return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(r);
      d->kind = DeviceRecord::Kind::kMemset;
      d->device = m->deviceId;
      d->stream = m->streamId;
      d->correlation = m->correlationId;
      d->start = m->start;
      d->end = m->end;
      d->bytes = m->bytes;
      d->value = m->value;
      return true;
    }
    default:
      ++unknown_;
      return false;
  }
}

std::unique_ptr<ActivityReader> ActivityReader::open(const Api& api, std::string* why) {
  std::unique_ptr<ActivityReader> r(new ActivityReader(api));
  r->buffers_ = ActivityBuffers::start(
      api, [](void* self) { static_cast<ActivityReader*>(self)->worker_.wake(); }, r.get(), why);
  if (!r->buffers_) return nullptr;
  return r;
}

ActivityReader::~ActivityReader() {
  stop();
}

int ActivityReader::current_pid() {
  return static_cast<int>(getpid());
}

void ActivityReader::start() {
  {
    std::lock_guard lk(mu_);
    running_ = true;
  }
  last_flush_ns_ = monotonic_ns();
  worker_.start(std::chrono::milliseconds(kPeriodMs), [this] { pass(); });
}

void ActivityReader::pass() {
  uint64_t asked = 0;
  {
    std::lock_guard lk(mu_);
    asked = sync_asked_;
  }
  const bool syncing = asked != sync_done_;
  // Buffers complete when full (the wake) or when flushed: flush now and then
  // so that a slow job's records do not wait for its end.
  if (syncing || monotonic_ns() - last_flush_ns_ >= kFlushMs * 1000000ull) {
    buffers_->flush();
    last_flush_ns_ = monotonic_ns();
  }
  buffers_->drain_buffers(scratch_, [&](std::span<const DeviceRecord> records) {
    for (ActivityListener* l : listeners_) l->on_records(records);
  });
  if (syncing) {
    {
      std::lock_guard lk(mu_);
      sync_done_ = asked;
    }
    synced_.notify_all();
  }
}

bool ActivityReader::sync(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  if (!running_ || current_pid() != owner_pid_) return false;
  const uint64_t ticket = ++sync_asked_;
  lk.unlock();
  worker_.wake();
  lk.lock();
  return synced_.wait_for(lk, timeout, [&] { return sync_done_ >= ticket || !running_; }) &&
         sync_done_ >= ticket;
}

void ActivityReader::stop() {
  if (current_pid() != owner_pid_) return;  // a fork's copy: no thread to join
  {
    std::lock_guard lk(mu_);
    if (!running_) return;
  }
  sync(std::chrono::milliseconds(2 * kFlushMs + 1000));
  worker_.stop();
  {
    std::lock_guard lk(mu_);
    running_ = false;
  }
  synced_.notify_all();
}

uint64_t ActivityReader::dropped() {
  std::lock_guard lk(mu_);
  return buffers_->dropped();
}

}  // namespace spillway::cupti
