#include "mover.h"

#include "access.h"

namespace spillway {

void Mover::start() {
  worker_.start(std::chrono::milliseconds(5), [this] { round(); });
}

void Mover::round() {
  InternalCalls internal;  // its driver calls are spillway's, not the job's
  if (work_) work_();
  CUevent oldest = begin_(spare_.get());
  if (!oldest) return;
  // The copies run without the allocator's lock: allocations go on. If the
  // wait fails, end() finds which copies are done by itself.
  CU_CALL(d_, cuEventSynchronize, oldest);
  if (before_swap_) before_swap_();
  if (end_()) worker_.wake();
}

}  // namespace spillway
