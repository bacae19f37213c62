#include "copy_streams.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace spillway {
namespace {

// Polls a query until it stops saying "not ready": the second way to learn
// that work is done when a wait or a record failed (failure paths only).
template <class Query>
CUresult poll(Query&& query) {
  CUresult r;
  while ((r = query()) == CUDA_ERROR_NOT_READY) std::this_thread::yield();
  return r;
}

}  // namespace

CUresult CopyStreams::not_capturing(CUstream s) const {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = d_.cuStreamIsCapturing(s, &status);
  if (r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE)
    r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return r;
}

CUresult CopyStreams::order_after(CUstream waiter, CUstream s) {
  if (CUresult c = not_capturing(s); c != CUDA_SUCCESS) return c;
  CUresult r = CU_CALL(d_, cuEventRecord, ev_.get(), s);
  if (r == CUDA_SUCCESS) r = CU_CALL(d_, cuStreamWaitEvent, waiter, ev_.get(), 0);
  return r;
}

CUresult CopyStreams::order_after_uses(CUstream waiter, const Block& b) {
  auto one = [&](CUstream s) {
    if (const UseMark* m = mark_of(b, s))
      return CU_CALL(d_, cuStreamWaitEvent, waiter, m->ev.get(), 0);
    return order_after(waiter, s);
  };
  CUresult r = one(b.stream);
  for (CUstream u : b.users)
    if (r == CUDA_SUCCESS) r = one(u);
  return r;
}

CUresult CopyStreams::wait_uses(const Block& b) {
  auto one = [&](CUstream s) {
    if (const UseMark* m = mark_of(b, s)) return wait_event(m->ev.get(), false);
    return drain(s);
  };
  CUresult r = one(b.stream);
  for (CUstream u : b.users)
    if (r == CUDA_SUCCESS) r = one(u);
  return r;
}

CUresult CopyStreams::drain(CUstream s) {
  if (CUresult c = not_capturing(s); c != CUDA_SUCCESS) return c;
  const CUresult r = CU_CALL(d_, cuEventRecord, ev_.get(), s);
  if (r == CUDA_SUCCESS) return wait_event(ev_.get(), s == d2h() || s == h2d());
  // No event to wait for: the stream's own state says when its work is done.
  return poll([&] { return d_.cuStreamQuery(s); });
}

CUresult CopyStreams::wait_event(CUevent e, bool for_copies) {
  // A wait that fails is asked again by query: memory a copy writes is
  // reused only once its end is known (a sticky error fails both).
  auto sync = [&] {
    const CUresult r = CU_CALL(d_, cuEventSynchronize, e);
    return r == CUDA_SUCCESS ? r : poll([&] { return d_.cuEventQuery(e); });
  };
  if (!for_copies) return sync();
  const auto t0 = std::chrono::steady_clock::now();
  const CUresult r = sync();
  waited_ns_ += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count());
  return r;
}

UseMark* CopyStreams::record_mark(CUstream s) {
  UseMark* m = nullptr;
  if (!free_marks_.empty()) {
    m = free_marks_.back();
    free_marks_.pop_back();
  } else {
    auto fresh = std::make_unique<UseMark>();
    fresh->ev = Event(d_);
    if (!fresh->ev) return nullptr;
    m = marks_.emplace_back(std::move(fresh)).get();
  }
  if (CU_CALL(d_, cuEventRecord, m->ev.get(), s) != CUDA_SUCCESS) {
    free_marks_.push_back(m);
    return nullptr;
  }
  fence(s, m);
  return m;
}

std::vector<Block*>* CopyStreams::unfenced_on(CUstream s) {
  for (auto& [stream, v] : unfenced_)
    if (stream == s) return &v;
  return nullptr;
}

void CopyStreams::fence(CUstream s, UseMark* m) {
  std::vector<Block*>* v = unfenced_on(s);
  if (!v || v->empty()) return;
  for (Block* b : *v) {
    b->unfenced = false;
    set_mark(*b, s, m);
  }
  v->clear();
}

void CopyStreams::freed(Block& b) {
  std::vector<Block*>* v = unfenced_on(b.stream);
  if (!v) v = &unfenced_.emplace_back(b.stream, std::vector<Block*>{}).second;
  v->push_back(&b);
  b.unfenced = true;
  // A stream capturing a graph gets no fence: its blocks wait for its tail.
  if (v->size() >= kFreesPerFence && not_capturing(b.stream) == CUDA_SUCCESS) record_mark(b.stream);
}

void CopyStreams::reused(Block& b) {
  if (b.unfenced) {
    if (std::vector<Block*>* v = unfenced_on(b.stream)) std::erase(*v, &b);
    b.unfenced = false;
  }
  clear_marks(b);
}

CUresult CopyStreams::wait_freed(Block& b) {
  if (b.unfenced && not_capturing(b.stream) == CUDA_SUCCESS) record_mark(b.stream);
  return wait_uses(b);  // a cached block's users were waited for before its reuse
}

CUresult CopyStreams::query_freed(const Block& b) const {
  const UseMark* m = mark_of(b, b.stream);
  return m ? d_.cuEventQuery(m->ev.get()) : CUDA_ERROR_NOT_READY;
}

UseMark* CopyStreams::mark_of(const Block& b, CUstream s) const {
  for (const auto& [stream, m] : b.marks)
    if (stream == s) return m;
  return nullptr;
}

void CopyStreams::unref(UseMark* m) {
  if (--m->refs == 0) free_marks_.push_back(m);
}

void CopyStreams::set_mark(Block& b, CUstream s, UseMark* m) {
  ++m->refs;  // first: `m` may be the mark it replaces
  for (auto& [stream, old] : b.marks)
    if (stream == s) {
      unref(old);
      old = m;
      return;
    }
  b.marks.push_back({s, m});
}

void CopyStreams::clear_mark(Block& b, CUstream s) {
  for (size_t i = 0; i < b.marks.size(); ++i)
    if (b.marks[i].first == s) {
      unref(b.marks[i].second);
      b.marks[i] = b.marks.back();
      b.marks.pop_back();
      return;
    }
}

void CopyStreams::mark_tails(const std::vector<Block*>& blocks) {
  std::vector<std::pair<CUstream, UseMark*>> made;
  auto one = [&](Block& b, CUstream s) {
    if (mark_of(b, s)) return;  // kept: it may be earlier
    auto it = std::find_if(made.begin(), made.end(), [&](const auto& e) { return e.first == s; });
    if (it == made.end()) {
      UseMark* m = not_capturing(s) == CUDA_SUCCESS ? record_mark(s) : nullptr;
      it = made.insert(made.end(), {s, m});
    }
    if (it->second) set_mark(b, s, it->second);
  };
  for (Block* b : blocks) {
    one(*b, b->stream);
    for (CUstream u : b->users) one(*b, u);
  }
}

void CopyStreams::mark_departure(Block& b) {
  clear_departure(b);
  if ((b.departure = record_mark(d2h()))) ++b.departure->refs;
}

CUresult CopyStreams::departed(const Block& b) const {
  return b.departure ? d_.cuEventQuery(b.departure->ev.get()) : d_.cuStreamQuery(d2h());
}

CUresult CopyStreams::wait_departure(const Block& b) {
  return b.departure ? wait(*b.departure) : drain(d2h());
}

CUresult CopyStreams::order_after_departure(CUstream waiter, const Block& b) {
  if (departed(b) == CUDA_SUCCESS) return CUDA_SUCCESS;
  if (!b.departure) return order_after(waiter, d2h());
  return CU_CALL(d_, cuStreamWaitEvent, waiter, b.departure->ev.get(), 0);
}

void CopyStreams::clear_departure(Block& b) {
  if (b.departure) unref(b.departure);
  b.departure = nullptr;
}

void CopyStreams::clear_marks(Block& b) {
  for (auto& [stream, m] : b.marks) unref(m);
  b.marks.clear();
}

}  // namespace spillway
