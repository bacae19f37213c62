#include "stream.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>
#include <unordered_map>

#include "device_access.h"
#include "memory.h"

namespace sim::stream {
namespace {

thread_local bool t_in_host_fn = false;

void mark_done(State& st, const std::shared_ptr<Op>& op) {
  // Before the op leaves the pending list: a cuMemUnmap of its memory then
  // either finds it pending (refused) or finds its end noted.
  if (!op->touched.empty()) mem::note_completed_use(op->touched, op->vend);
  {
    std::lock_guard lk(st.pending_mu);
    auto it = std::find(st.pending.begin(), st.pending.end(), op);
    if (it != st.pending.end()) {
      *it = st.pending.back();
      st.pending.pop_back();
    }
  }
  {
    std::lock_guard lk(st.done_mu);
    op->done.store(true, std::memory_order_release);
    op->effect = nullptr;  // release captured buffers early
  }
  st.done_cv.notify_all();
}

void wait_real(State& st, const std::shared_ptr<Op>& op) {
  if (op->done.load(std::memory_order_acquire)) return;
  std::unique_lock lk(st.done_mu);
  st.done_cv.wait(lk, [&] { return op->done.load(std::memory_order_acquire); });
}

void execute(Stream& s, const std::shared_ptr<Op>& op) {
  Context* ctx = s.ctx;
  // After an illegal access the context is unusable (sticky error): queued
  // work is dropped, as on hardware.
  if (!op->effect || ctx->sticky.load() != CUDA_SUCCESS) return;
  if (op->kind == Op::Kind::kHostFn) {
    t_in_host_fn = true;
    op->effect();
    t_in_host_fn = false;
    return;
  }
  uintptr_t fault = 0;
  if (!device_access::run(op->effect, &fault)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%#lx", static_cast<unsigned long>(fault));
    set_sticky(ctx, CUDA_ERROR_ILLEGAL_ADDRESS,
               "illegal address " + std::string(buf) + " in " + op->what + " on stream " +
                   std::to_string(s.stream_id));
  }
}

void worker(std::shared_ptr<Stream> s) {
  State& st = *state();
  std::mt19937_64 rng(st.config.jitter_seed ^ (0x9E3779B97F4A7C15ull * (s->stream_id + 1)));
  std::uniform_int_distribution<uint64_t> jitter_us(0, st.config.jitter_max_us);
  for (;;) {
    std::shared_ptr<Op> op;
    {
      std::unique_lock lk(s->mu);
      s->cv.wait(lk, [&] { return !s->queue.empty() || s->retiring; });
      if (s->queue.empty()) break;  // retiring and drained
      op = s->queue.front();
    }
    for (const auto& d : op->deps) wait_real(st, d);
    if (st.config.jitter_seed != 0 && (rng() & 1))
      std::this_thread::sleep_for(std::chrono::microseconds(jitter_us(rng)));
    execute(*s, op);
    if (op->report_activity) {
      if (const simbridge::Hooks* h = cupti_hooks(); h && h->activity) {
        op->activity.start_ns = op->vstart;
        op->activity.end_ns = op->vend;
        op->activity.stream_id = s->stream_id;
        op->activity.context_id = s->ctx->id;
        op->activity.device_id = static_cast<uint32_t>(s->ctx->device);
        h->activity(op->activity);
      }
    }
    op->deps.clear();  // do not keep finished chains alive
    {
      std::lock_guard lk(s->mu);
      s->queue.pop_front();
    }
    mark_done(st, op);
  }
  std::lock_guard lk(s->ctx->streams_mu);
  auto& v = s->ctx->streams;
  v.erase(std::remove(v.begin(), v.end(), s), v.end());
}

std::shared_ptr<Stream> make_stream(Context* ctx, unsigned flags, int priority, bool legacy,
                                    bool per_thread) {
  State& st = *state();
  auto s = std::make_shared<Stream>();
  s->ctx = ctx;
  s->flags = flags;
  s->priority = priority;
  s->legacy = legacy;
  s->per_thread = per_thread;
  s->stream_id = st.next_stream_id.fetch_add(1);
  std::thread(worker, s).detach();
  return s;
}

bool blocking(const Stream& s) {
  return !s.legacy && !(s.flags & CU_STREAM_NON_BLOCKING);
}

std::shared_ptr<Event> find_event(CUevent ev) {
  State* st = state();
  if (!st) return nullptr;
  std::lock_guard lk(st->handles_mu);
  auto it = st->events.find(reinterpret_cast<uint64_t>(ev));
  return it == st->events.end() ? nullptr : it->second;
}

}  // namespace

CUresult resolve(Context* ctx, CUstream handle, std::shared_ptr<Stream>* out) {
  State& st = *state();
  if (handle == nullptr || handle == CU_STREAM_LEGACY) {
    *out = ctx->legacy;
    return CUDA_SUCCESS;
  }
  if (handle == CU_STREAM_PER_THREAD) {
    thread_local std::unordered_map<Context*, std::shared_ptr<Stream>> per_thread;
    auto& s = per_thread[ctx];
    if (!s) {
      s = make_stream(ctx, 0, 0, false, true);
      std::lock_guard lk(ctx->streams_mu);
      ctx->streams.push_back(s);
    }
    *out = s;
    return CUDA_SUCCESS;
  }
  std::lock_guard lk(st.handles_mu);
  auto it = st.streams.find(reinterpret_cast<uint64_t>(handle));
  if (it == st.streams.end())
    return refuse(CUDA_ERROR_INVALID_HANDLE, "stream %p does not exist (destroyed?)", handle);
  if (it->second->ctx != ctx)
    return refuse(CUDA_ERROR_INVALID_HANDLE, "stream %p belongs to another context", handle);
  *out = it->second;
  return CUDA_SUCCESS;
}

bool find_created(CUstream handle, std::shared_ptr<Stream>* out) {
  State& st = *state();
  std::lock_guard lk(st.handles_mu);
  auto it = st.streams.find(reinterpret_cast<uint64_t>(handle));
  if (it == st.streams.end()) return false;
  *out = it->second;
  return true;
}

CUresult create(Context* ctx, CUstream* out, unsigned flags, int priority) {
  if (!out) return refuse(CUDA_ERROR_INVALID_VALUE, "cuStreamCreate: null output");
  if (flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING))
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuStreamCreate: bad flags %#x", flags);
  State& st = *state();
  // cuCtxGetStreamPriorityRange reports [-5, 0]; values outside are clamped (cuda.h).
  priority = std::clamp(priority, -5, 0);
  auto s = make_stream(ctx, flags, priority, false, false);
  s->handle_id = new_handle();
  {
    std::lock_guard lk(st.handles_mu);
    st.streams[s->handle_id] = s;
  }
  {
    std::lock_guard lk(ctx->streams_mu);
    ctx->streams.push_back(s);
  }
  *out = reinterpret_cast<CUstream>(s->handle_id);
  return CUDA_SUCCESS;
}

std::shared_ptr<Stream> create_legacy(Context* ctx) {
  return make_stream(ctx, 0, 0, true, false);
}

CUresult destroy(CUstream handle) {
  State& st = *state();
  std::shared_ptr<Stream> s;
  {
    std::lock_guard lk(st.handles_mu);
    auto it = st.streams.find(reinterpret_cast<uint64_t>(handle));
    if (it == st.streams.end())
      return refuse(CUDA_ERROR_INVALID_HANDLE, "cuStreamDestroy: stream %p does not exist", handle);
    s = it->second;
    st.streams.erase(it);
  }
  // cuda.h: if work is still pending, cuStreamDestroy returns at once and the
  // resources are released when the work completes. Until then the stream
  // stays in its context's list, so cuCtxSynchronize and the legacy stream
  // still wait for that work; its worker removes it once drained.
  {
    std::lock_guard lk(s->mu);
    s->retiring = true;
  }
  s->cv.notify_all();
  return CUDA_SUCCESS;
}

void enqueue(const std::shared_ptr<Stream>& s, const std::shared_ptr<Op>& op, const Placer& place) {
  State& st = *state();
  Device& dev = *st.devices[static_cast<size_t>(s->ctx->device)];
  {
    std::lock_guard sched(dev.sched_mu);
    uint64_t earliest = std::max(clock::now(), s->tail);
    for (const auto& d : op->deps) earliest = std::max(earliest, d->vend);
    // Legacy default stream semantics (CUDA programming guide, "Default
    // stream"): it waits for all blocking streams of its context, and they
    // wait for it. Non-blocking streams are exempt.
    if (s->legacy) {
      std::lock_guard lk(s->ctx->streams_mu);
      for (const auto& other : s->ctx->streams) {
        if (!blocking(*other) || !other->last) continue;
        if (!other->last->done.load()) op->deps.push_back(other->last);
        earliest = std::max(earliest, other->tail);
      }
    } else if (blocking(*s)) {
      const auto& legacy = s->ctx->legacy;
      if (legacy->last) {
        if (!legacy->last->done.load()) op->deps.push_back(legacy->last);
        earliest = std::max(earliest, legacy->tail);
      }
    }
    clock::Interval iv = place(dev, earliest);
    op->vstart = iv.start;
    op->vend = iv.end;
    s->tail = iv.end;
    s->last = op;
    dev.idle_at.store(std::max(dev.idle_at.load(), iv.end));
    {
      std::lock_guard lk(st.pending_mu);
      st.pending.push_back(op);
    }
    {
      std::lock_guard lk(s->mu);
      s->queue.push_back(op);
    }
  }
  s->cv.notify_one();
}

void enqueue_marker(const std::shared_ptr<Stream>& s, const std::shared_ptr<Op>& op) {
  op->kind = Op::Kind::kMarker;
  enqueue(s, op, [](Device&, uint64_t earliest) { return clock::Interval{earliest, earliest}; });
}

void wait(const std::shared_ptr<Op>& op) {
  wait_real(*state(), op);
  clock::advance_to(op->vend);
}

bool is_complete(const std::shared_ptr<Op>& op) {
  return op->done.load(std::memory_order_acquire) && op->vend <= clock::now();
}

CUresult synchronize(Stream& s) {
  std::shared_ptr<Op> last;
  {
    Device& dev = *state()->devices[static_cast<size_t>(s.ctx->device)];
    std::lock_guard lk(dev.sched_mu);
    last = s.last;
  }
  if (last) wait(last);
  return s.ctx->sticky.load();
}

CUresult query(Stream& s) {
  std::shared_ptr<Op> last;
  {
    Device& dev = *state()->devices[static_cast<size_t>(s.ctx->device)];
    std::lock_guard lk(dev.sched_mu);
    last = s.last;
  }
  if (CUresult e = s.ctx->sticky.load(); e != CUDA_SUCCESS) return e;
  return !last || is_complete(last) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult synchronize_context(Context* ctx) {
  std::vector<std::shared_ptr<Stream>> all;
  {
    std::lock_guard lk(ctx->streams_mu);
    all = ctx->streams;
  }
  all.push_back(ctx->legacy);
  for (const auto& s : all) synchronize(*s);
  return ctx->sticky.load();
}

bool pending_overlaps(uintptr_t lo, uintptr_t hi, std::string* what) {
  State& st = *state();
  std::lock_guard lk(st.pending_mu);
  for (const auto& op : st.pending) {
    for (const Range& r : op->touched) {
      if (r.overlaps(lo, hi)) {
        if (what) *what = op->what;
        return true;
      }
    }
  }
  return false;
}

void wait_for_range(uintptr_t lo, uintptr_t hi) {
  State& st = *state();
  std::vector<std::shared_ptr<Op>> users;
  {
    std::lock_guard lk(st.pending_mu);
    for (const auto& op : st.pending)
      for (const Range& r : op->touched)
        if (r.overlaps(lo, hi)) users.push_back(op);
  }
  for (const auto& op : users) wait(op);
}

bool in_host_function() {
  return t_in_host_fn;
}

CUresult launch_host_func(const std::shared_ptr<Stream>& s, CUhostFn fn, void* data,
                          std::shared_ptr<Op>* out) {
  if (!fn) return refuse(CUDA_ERROR_INVALID_VALUE, "cuLaunchHostFunc: null function");
  auto op = std::make_shared<Op>();
  op->kind = Op::Kind::kHostFn;
  op->what = "host function";
  op->effect = [fn, data] { fn(data); };
  enqueue(s, op, [](Device&, uint64_t earliest) { return clock::Interval{earliest, earliest}; });
  if (out) *out = op;
  return CUDA_SUCCESS;
}

CUresult event_create(Context* ctx, CUevent* out, unsigned flags) {
  if (!out) return refuse(CUDA_ERROR_INVALID_VALUE, "cuEventCreate: null output");
  constexpr unsigned kKnown =
      CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (flags & ~kKnown)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuEventCreate: bad flags %#x", flags);
  // cuda.h: CU_EVENT_INTERPROCESS requires CU_EVENT_DISABLE_TIMING.
  if ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING))
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuEventCreate: INTERPROCESS needs DISABLE_TIMING");
  State& st = *state();
  auto ev = std::make_shared<Event>();
  ev->flags = flags;
  ev->ctx = ctx;
  uint64_t id = new_handle();
  {
    std::lock_guard lk(st.handles_mu);
    st.events[id] = ev;
  }
  *out = reinterpret_cast<CUevent>(id);
  return CUDA_SUCCESS;
}

CUresult event_destroy(CUevent handle) {
  State& st = *state();
  std::lock_guard lk(st.handles_mu);
  // cuda.h: destroying an event whose record has not completed is allowed;
  // resources are released when it completes (the op holds no reference back).
  if (st.events.erase(reinterpret_cast<uint64_t>(handle)) == 0)
    return refuse(CUDA_ERROR_INVALID_HANDLE, "cuEventDestroy: event %p does not exist", handle);
  return CUDA_SUCCESS;
}

CUresult event_record(CUevent handle, const std::shared_ptr<Stream>& s) {
  auto ev = find_event(handle);
  if (!ev)
    return refuse(CUDA_ERROR_INVALID_HANDLE, "cuEventRecord: event %p does not exist", handle);
  auto op = std::make_shared<Op>();
  op->what = "event record";
  enqueue_marker(s, op);
  std::lock_guard lk(state()->handles_mu);
  ev->recorded = op;
  ev->vtime = op->vend;
  return CUDA_SUCCESS;
}

CUresult event_query(CUevent handle) {
  auto ev = find_event(handle);
  if (!ev)
    return refuse(CUDA_ERROR_INVALID_HANDLE, "cuEventQuery: event %p does not exist", handle);
  std::shared_ptr<Op> op;
  {
    std::lock_guard lk(state()->handles_mu);
    op = ev->recorded;
  }
  if (CUresult e = ev->ctx->sticky.load(); e != CUDA_SUCCESS) return e;
  // cuda.h: an event never recorded counts as completed.
  return !op || is_complete(op) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult event_synchronize(CUevent handle) {
  auto ev = find_event(handle);
  if (!ev)
    return refuse(CUDA_ERROR_INVALID_HANDLE, "cuEventSynchronize: event %p does not exist", handle);
  std::shared_ptr<Op> op;
  {
    std::lock_guard lk(state()->handles_mu);
    op = ev->recorded;
  }
  if (op) wait(op);
  return ev->ctx->sticky.load();
}

CUresult event_elapsed(float* ms, CUevent start, CUevent end) {
  if (!ms) return refuse(CUDA_ERROR_INVALID_VALUE, "cuEventElapsedTime: null output");
  auto a = find_event(start), b = find_event(end);
  if (!a || !b) return refuse(CUDA_ERROR_INVALID_HANDLE, "cuEventElapsedTime: unknown event");
  // cuda.h: events created with CU_EVENT_DISABLE_TIMING, or never recorded,
  // give CUDA_ERROR_INVALID_HANDLE; unfinished ones CUDA_ERROR_NOT_READY.
  if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING)
    return refuse(CUDA_ERROR_INVALID_HANDLE, "cuEventElapsedTime: an event has DISABLE_TIMING");
  std::shared_ptr<Op> oa, ob;
  uint64_t ta, tb;
  {
    std::lock_guard lk(state()->handles_mu);
    oa = a->recorded;
    ob = b->recorded;
    ta = a->vtime;
    tb = b->vtime;
  }
  if (!oa || !ob) return refuse(CUDA_ERROR_INVALID_HANDLE, "cuEventElapsedTime: not recorded");
  if (!is_complete(oa) || !is_complete(ob)) return CUDA_ERROR_NOT_READY;
  *ms = static_cast<float>((static_cast<double>(tb) - static_cast<double>(ta)) / 1e6);
  return CUDA_SUCCESS;
}

CUresult wait_event(const std::shared_ptr<Stream>& s, CUevent handle, unsigned flags) {
  auto ev = find_event(handle);
  if (!ev)
    return refuse(CUDA_ERROR_INVALID_HANDLE, "cuStreamWaitEvent: event %p does not exist", handle);
  if (flags & ~static_cast<unsigned>(CU_EVENT_WAIT_EXTERNAL))
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuStreamWaitEvent: bad flags %#x", flags);
  std::shared_ptr<Op> rec;
  {
    std::lock_guard lk(state()->handles_mu);
    rec = ev->recorded;
  }
  if (!rec) return CUDA_SUCCESS;  // never recorded: nothing to wait for
  // The wait binds to the record current now; a later record does not matter.
  auto op = std::make_shared<Op>();
  op->what = "event wait";
  op->deps.push_back(rec);
  enqueue_marker(s, op);
  return CUDA_SUCCESS;
}

int event_status(CUevent handle) {
  auto ev = find_event(handle);
  if (!ev) return -1;
  std::lock_guard lk(state()->handles_mu);
  return ev->recorded ? 1 : 0;
}

}  // namespace sim::stream
