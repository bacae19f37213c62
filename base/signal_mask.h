// Threads that a signal handler waits for (the trace writer, the activity
// reader) must never run that handler themselves. A thread inherits the
// signal mask of the thread that starts it, so blocking the signals around
// the start is the only race-free way: blocking them from inside the new
// thread leaves a window in which the signal can land there.
#pragma once

#include <pthread.h>
#include <signal.h>

namespace spillway {

class BlockTermSignals {
 public:
  BlockTermSignals() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, &old_);
  }
  ~BlockTermSignals() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  BlockTermSignals(const BlockTermSignals&) = delete;
  BlockTermSignals& operator=(const BlockTermSignals&) = delete;

 private:
  sigset_t old_;
};

}  // namespace spillway
