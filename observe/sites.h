// SPILLWAY_STACKS=1: the native call site of each large allocation, so that
// the exit summary, the record (SPILLWAY_RECORD) and the trace (SPILLWAY_TRACE)
// can say which code's blocks were evicted most.
//
// The stack is taken with libunwind's unw_backtrace, from libunwind.so.8
// opened with RTLD_LOCAL at start: linked normally, libunwind would also
// export _Unwind_RaiseException and the rest of the unwinder ABI from the
// preloaded library and take over C++ exceptions in the whole process.
//
// A site is one distinct stack; its name is the first frame outside
// libspillway.so and PyTorch's c10 allocator layer ("module!symbol+0xoff"),
// computed once per distinct stack.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "events.h"

namespace spillway {

// First in the observer list: it names the site of allocations of at least
// `min_block` bytes, and of transfers of their blocks, for the observers
// after it.
class Sites final : public Observer {
 public:
  // nullptr and why if libunwind cannot be had.
  static std::unique_ptr<Sites> start(size_t min_block, std::string* why);

  // A large allocation: its stack is taken here, on the allocating thread.
  void annotate(Allocation& a) override;
  // Evictions are attributed to the evicted block's site.
  void annotate(Transfer& t) override;
  void on_free(const Allocation& a) override;

  // The sites whose blocks were evicted most, for the exit summary: up to
  // `n` lines "BYTES bytes evicted in COUNT evictions, ALLOCS allocations: NAME".
  std::string top(size_t n) const;

 private:
  using Backtrace = int (*)(void**, int);
  struct Site {
    std::string name;
    uint64_t allocations = 0, bytes_allocated = 0;
    uint64_t evictions = 0, bytes_evicted = 0;
  };
  Sites(size_t min_block, Backtrace bt) : min_block_(min_block), backtrace_(bt) {}
  std::string name_of(void* const* frames, int n) const;

  const size_t min_block_;
  const Backtrace backtrace_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, std::unique_ptr<Site>> sites_;  // by stack hash
  std::unordered_map<uintptr_t, Site*> live_;                  // large blocks by address
};

}  // namespace spillway
