// The one list every event goes through: the runtime owns it and hands it to
// each allocator as its Observer; the C ABI (allocations, frees), the
// tracker's accesses, step marks and spillway's own copies (through the
// tracker's internal-call hook) reach it through the runtime. It calls each
// observer in the order they were added; no observer forwards to another.
#pragma once

#include <cupti.h>

#include <array>
#include <cstddef>

#include "events.h"

namespace spillway {

class Observers final : public Observer {
 public:
  static constexpr size_t kMax = 8;

  // Before the first event only: the list is read without a lock. An
  // observer that annotates (Sites) goes first.
  void add(Observer* o) {
    if (o && n_ < kMax) list_[n_++] = o;
  }
  bool empty() const { return n_ == 0; }

  void on_alloc(const Allocation& a) override;
  void on_free(const Allocation& a) override;
  void on_access(const Access& a, const Touch* touches, size_t n) override;
  void on_step(uint64_t step) override;
  void on_transfer(const Transfer& t) override;
  void on_memory(int device, uint64_t resident, uint64_t host, uint64_t budget) override;
  void on_oom_avoided(int device, size_t need, size_t freed) override;
  void on_own_copy(const OwnCopy& c) override;

  // Tracker::InternalCallHook (ctx: the list): spillway's own driver calls;
  // its copies become on_own_copy.
  static void internal_call(void* self, CUpti_CallbackId cbid, const CUpti_CallbackData* cb);

 private:
  std::array<Observer*, kMax> list_{};
  size_t n_ = 0;
};

}  // namespace spillway
