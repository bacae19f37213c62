// SIGTERM and SIGINT, the signals a job is told to stop with (a scheduler's
// preemption, `kill`, Ctrl-C). spillway's files (the Chrome trace, the
// record, the statistics) must be complete when the process dies of one
// (issue 15 item 4, docs/profiling.md "When the job ends"). One handler
// for both signals runs spillway's hooks, then what was there before it:
//
// - the default action (terminate): the hooks are told `fatal`, finish
//   their files, and the signal is raised again with its default action,
//   so the process still dies of it;
// - a handler of the job's own (Python's KeyboardInterrupt for SIGINT): the
//   hooks are told not `fatal` (the job goes on, and its exit finishes the
//   files), then that handler runs;
// - an ignored signal stays ignored: no handler is installed for it.
//
// A hook runs inside the signal handler: it may only make async-signal-safe
// calls. Work that is not (closing a file behind a lock) is handed to a
// thread of spillway's, which blocks these signals, with a bounded wait
// (Finisher): a thread stuck behind a lock the interrupted thread holds
// then costs the file's last writes, never a hang.
#pragma once

#include <functional>

namespace spillway::term_signals {

using Hook = void (*)(bool fatal);

// Adds a hook, run after those added before it, and installs the handler
// the first time. False if the table (4 hooks) is full.
bool add(Hook hook);

// A thread that runs `work` each time a signal handler asks, and lets the
// handler wait for it. Lives as long as the process (the thread is never
// joined; a signal may come at any time).
class Finisher {
 public:
  explicit Finisher(std::function<void()> work);
  Finisher(const Finisher&) = delete;
  Finisher& operator=(const Finisher&) = delete;
  // Async-signal-safe: asks for the work (sem_post) and waits up to `ms`
  // milliseconds (nanosleep) for it to end. True if it ended.
  bool request_and_wait(int ms);

 private:
  struct State;
  State* s_;  // never freed: the thread outlives any owner
};

}  // namespace spillway::term_signals
