#include "term_signals.h"

#include <semaphore.h>
#include <signal.h>
#include <time.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "signal_mask.h"

namespace spillway::term_signals {
namespace {

constexpr int kMaxHooks = 4;
std::atomic<Hook> g_hooks[kMaxHooks];
std::atomic<int> g_installed{0};
struct sigaction g_prev_int, g_prev_term;

void on_signal(int sig, siginfo_t* info, void* uctx) {
  const int saved = errno;
  const struct sigaction& prev = sig == SIGINT ? g_prev_int : g_prev_term;
  const bool handler = (prev.sa_flags & SA_SIGINFO) != 0;
  const bool fatal = !handler && prev.sa_handler == SIG_DFL;
  for (auto& h : g_hooks)
    if (Hook f = h.load(std::memory_order_acquire)) f(fatal);
  if (handler) {
    if (prev.sa_sigaction) prev.sa_sigaction(sig, info, uctx);
  } else if (fatal) {
    // The default action, with the signal still the cause of death: it is
    // blocked while this handler runs and delivered when it returns.
    sigaction(sig, &prev, nullptr);
    raise(sig);
  } else if (prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
  }
  errno = saved;
}

void install() {
  if (g_installed.exchange(1, std::memory_order_acq_rel)) return;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = &on_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM}) {
    struct sigaction& prev = sig == SIGINT ? g_prev_int : g_prev_term;
    if (sigaction(sig, nullptr, &prev) != 0) continue;
    const bool ignored = !(prev.sa_flags & SA_SIGINFO) && prev.sa_handler == SIG_IGN;
    if (!ignored) sigaction(sig, &sa, nullptr);
  }
}

}  // namespace

bool add(Hook hook) {
  for (auto& h : g_hooks) {
    Hook empty = nullptr;
    if (h.compare_exchange_strong(empty, hook, std::memory_order_acq_rel)) {
      install();
      return true;
    }
  }
  return false;
}

struct Finisher::State {
  sem_t asked;
  std::atomic<uint64_t> requests{0}, done{0};
  std::function<void()> work;
};

Finisher::Finisher(std::function<void()> work) : s_(new State) {
  sem_init(&s_->asked, 0, 0);
  s_->work = std::move(work);
  // The handler waits for this thread: it must never run the handler itself.
  BlockTermSignals blocked;
  std::thread([s = s_] {
    for (;;) {
      if (sem_wait(&s->asked) != 0) continue;  // EINTR
      const uint64_t asked = s->requests.load(std::memory_order_acquire);
      s->work();
      s->done.store(asked, std::memory_order_release);
    }
  }).detach();
}

bool Finisher::request_and_wait(int ms) {
  const uint64_t ticket = s_->requests.fetch_add(1, std::memory_order_acq_rel) + 1;
  sem_post(&s_->asked);
  const timespec one_ms{0, 1000000};
  for (int i = 0; i < ms; ++i) {
    if (s_->done.load(std::memory_order_acquire) >= ticket) return true;
    nanosleep(&one_ms, nullptr);
  }
  return false;
}

}  // namespace spillway::term_signals
