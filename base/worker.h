// A background thread that runs one function when woken, or at least every
// `period`, until stopped: spillway's own threads (the background mover, the
// trace writers' flushers) are all this shape. The function runs without any
// lock of the worker's; wake() never blocks, so it may be called under the
// caller's own locks (the allocator's, say).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "signal_mask.h"

namespace spillway {

class Worker {
 public:
  Worker() = default;
  ~Worker() { stop(); }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Starts the thread. `run` is called once per wake-up or period; it is
  // never called again once stop() has returned.
  void start(std::chrono::milliseconds period, std::function<void()> run) {
    stop();
    run_ = std::move(run);
    stopping_ = false;
    woken_ = false;
    // A SIGTERM handler waits for spillway's threads (base/term_signals.h):
    // none of them may run it.
    BlockTermSignals blocked;
    thread_ = std::thread([this, period] { loop(period); });
  }
  void wake() {
    {
      std::lock_guard lk(mu_);
      woken_ = true;
    }
    cv_.notify_one();
  }
  // Waits for the run in progress (if any) to end. Idempotent.
  void stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

 private:
  void loop(std::chrono::milliseconds period) {
    std::unique_lock lk(mu_);
    while (!stopping_) {
      cv_.wait_for(lk, period, [&] { return woken_ || stopping_; });
      if (stopping_) break;
      woken_ = false;
      lk.unlock();
      run_();
      lk.lock();
    }
  }

  std::function<void()> run_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool woken_ = false, stopping_ = false;
  std::thread thread_;
};

}  // namespace spillway
