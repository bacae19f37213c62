#include "device_access.h"

#include <csetjmp>
#include <csignal>
#include <cstring>
#include <mutex>

namespace sim::device_access {
namespace {

thread_local sigjmp_buf* t_jump = nullptr;
thread_local volatile uintptr_t t_fault = 0;
struct sigaction g_prev_segv, g_prev_bus;

void handler(int sig, siginfo_t* info, void* uctx) {
  if (t_jump) {
    t_fault = reinterpret_cast<uintptr_t>(info->si_addr);
    siglongjmp(*t_jump, 1);
  }
  // Not device work: hand the fault to whoever had it before us.
  const struct sigaction& prev = sig == SIGSEGV ? g_prev_segv : g_prev_bus;
  if (prev.sa_flags & SA_SIGINFO) {
    prev.sa_sigaction(sig, info, uctx);
  } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
  } else {
    signal(sig, SIG_DFL);  // returning re-executes the access and dies as usual
  }
}

}  // namespace

void install() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = handler;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_prev_segv);
    sigaction(SIGBUS, &sa, &g_prev_bus);
  });
}

bool run(const std::function<void()>& work, uintptr_t* fault) {
  sigjmp_buf jb;
  if (sigsetjmp(jb, 1) != 0) {
    t_jump = nullptr;
    *fault = t_fault;
    return false;
  }
  t_jump = &jb;
  work();
  t_jump = nullptr;
  return true;
}

}  // namespace sim::device_access
