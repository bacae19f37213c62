// The virtual clock. Each host thread has its own virtual time, advanced by
// the host cost of every driver call (config.h), by waits on device work and
// by handing physical memory between threads (cuMemUnmap / cuMemMap,
// memory.h). Device work is placed on its engine's timeline when it is
// enqueued, so simulated times are deterministic for a given sequence of
// calls, whatever the real threads do (jitter changes real timing only).
#pragma once

#include <cstdint>

#include "state.h"

namespace sim::clock {

uint64_t now();               // calling thread's virtual time
void advance(uint64_t ns);    // host work
void advance_to(uint64_t t);  // a host wait that ended at virtual time t

// Places `bytes` (or `duration_ns` for kernels) on `engine` no earlier than
// `earliest`, and returns the op's [start, end). Caller holds dev.sched_mu.
struct Interval {
  uint64_t start, end;
};
Interval schedule_fixed(Device& dev, Engine engine, uint64_t earliest, uint64_t duration_ns);
Interval schedule_copy(Device& dev, Engine engine, uint64_t earliest, uint64_t bytes,
                       const Config& cfg);

}  // namespace sim::clock
