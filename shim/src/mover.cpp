#include "mover.h"

#include "access.h"

namespace spillway {

void Mover::start() {
  worker_.start(std::chrono::milliseconds(5), [this] { round(); });
}

void Mover::round() {
  InternalCalls internal;  // its driver calls are spillway's, not the job's
  Batch batch = begin_(done_.get());
  if (batch.blocks.empty()) return;
  // The copies run without the allocator's lock: allocations go on.
  bool copied = batch.recorded && CU_CALL(d_, cuEventSynchronize, done_.get()) == CUDA_SUCCESS;
  if (before_swap_) before_swap_();
  end_(batch, copied);
}

}  // namespace spillway
