// Runs simulated device work (kernels, copy-engine and memset work) so that a
// fault on device memory becomes an error instead of a crash: SIGSEGV/SIGBUS
// raised while the calling thread is inside run() jumps back out of it. A
// fault anywhere else goes to the handler that was installed before ours.
#pragma once

#include <cstdint>
#include <functional>

namespace sim::device_access {

void install();  // idempotent
// Returns true if `work` completed, false if it faulted (address in *fault).
// `work` must not own resources that need destructors at the faulting point:
// the stack is abandoned with siglongjmp.
bool run(const std::function<void()>& work, uintptr_t* fault);

}  // namespace sim::device_access
