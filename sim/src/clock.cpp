#include "clock.h"

#include <algorithm>
#include <atomic>
#include <cmath>

namespace sim::clock {
namespace {

// The latest virtual time any thread reached. A thread's clock starts there:
// a new thread is born "now", not at time zero.
std::atomic<uint64_t> g_high_water{0};

uint64_t& thread_time() {
  thread_local uint64_t t = g_high_water.load(std::memory_order_relaxed);
  return t;
}

void publish(uint64_t t) {
  uint64_t cur = g_high_water.load(std::memory_order_relaxed);
  while (cur < t && !g_high_water.compare_exchange_weak(cur, t, std::memory_order_relaxed)) {
  }
}

EngineState& engine_state(Device& dev, Engine e) {
  switch (e) {
    case Engine::kCopyH2D:
      return dev.h2d;
    case Engine::kCopyD2H:
      return dev.d2h;
    default:
      return dev.compute;
  }
}

void note_busy(EngineState& es, Interval iv) {
  es.free_at = iv.end;
  es.busy.emplace_back(iv.start, iv.end);
  // Bounded memory: only the recent past can overlap work enqueued later.
  while (es.busy.size() > 256) es.busy.pop_front();
}

}  // namespace

uint64_t now() {
  return thread_time();
}

void advance(uint64_t ns) {
  thread_time() += ns;
  publish(thread_time());
}

void advance_to(uint64_t t) {
  if (thread_time() < t) thread_time() = t;
  publish(thread_time());
}

Interval schedule_fixed(Device& dev, Engine engine, uint64_t earliest, uint64_t duration_ns) {
  if (engine == Engine::kNone) return {earliest, earliest};
  EngineState& es = engine_state(dev, engine);
  Interval iv{std::max(earliest, es.free_at), 0};
  iv.end = iv.start + duration_ns;
  note_busy(es, iv);
  dev.idle_at.store(std::max(dev.idle_at.load(), iv.end));
  return iv;
}

Interval schedule_copy(Device& dev, Engine engine, uint64_t earliest, uint64_t bytes,
                       const Config& cfg) {
  if (engine == Engine::kCompute) {
    // Device-to-device: read and write both cross HBM.
    double ns = 2.0 * static_cast<double>(bytes) / cfg.hbm_bytes_per_ns;
    return schedule_fixed(dev, engine, earliest, static_cast<uint64_t>(std::ceil(ns)));
  }
  EngineState& es = engine_state(dev, engine);
  EngineState& other = engine == Engine::kCopyH2D ? dev.d2h : dev.h2d;
  const double solo = engine == Engine::kCopyH2D ? cfg.h2d_bytes_per_ns : cfg.d2h_bytes_per_ns;
  const double shared = std::min(solo, cfg.bidir_bytes_per_ns);

  // Walk forward through the opposite engine's busy intervals: while it is
  // busy the link gives this direction `shared` bytes/ns, otherwise `solo`.
  // Work already placed keeps its times (placement is final at enqueue).
  uint64_t t = std::max(earliest, es.free_at);
  const uint64_t start = t;
  double left = static_cast<double>(bytes);
  for (const auto& [a, b] : other.busy) {
    if (left <= 0) break;
    if (b <= t) continue;
    if (a > t) {  // idle gap before the next busy interval
      double gap_bytes = static_cast<double>(a - t) * solo;
      if (gap_bytes >= left) break;
      left -= gap_bytes;
      t = a;
    }
    double busy_bytes = static_cast<double>(b - t) * shared;
    if (busy_bytes >= left) {
      t += static_cast<uint64_t>(std::ceil(left / shared));
      left = 0;
      break;
    }
    left -= busy_bytes;
    t = b;
  }
  if (left > 0) t += static_cast<uint64_t>(std::ceil(left / solo));
  Interval iv{start, t};
  note_busy(es, iv);
  dev.idle_at.store(std::max(dev.idle_at.load(), iv.end));
  return iv;
}

}  // namespace sim::clock
