// Small steps for the planner's tests (policy/planner.h): blocks, moves and
// options written as the tests read them.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "planner.h"

namespace step_builders {

using spillway::policy::Move;
using spillway::policy::PlanOptions;
using spillway::policy::StepModel;

inline StepModel::Block block(uint64_t id, uint64_t bytes, uint32_t alloc, uint32_t free,
                              std::initializer_list<uint32_t> uses) {
  StepModel::Block b;
  b.id = id;
  b.bytes = bytes;
  b.alloc = alloc;
  b.free = free;
  b.uses = uses;
  return b;
}

inline StepModel::Block carried(uint64_t id, uint64_t bytes, std::initializer_list<uint32_t> uses) {
  StepModel::Block b = block(id, bytes, 0, StepModel::kLive, uses);
  b.carried = true;
  return b;
}

inline Move move(uint64_t block, uint32_t evict_after, uint32_t prefetch_at, uint32_t next_use) {
  Move mv;
  mv.block = block;
  mv.evict_after = evict_after;
  mv.prefetch_at = prefetch_at;
  mv.next_use = next_use;
  return mv;
}

// 1 byte per ns each way, both at once too: a copy of n bytes takes n ns.
inline PlanOptions options(uint64_t budget) {
  PlanOptions o;
  o.budget = budget;
  o.d2h_bytes_per_ns = o.h2d_bytes_per_ns = o.bidir_bytes_per_ns = 1;
  return o;
}

inline StepModel steps(std::vector<uint64_t> ns) {
  StepModel m;
  m.launch_ns = std::move(ns);
  return m;
}

}  // namespace step_builders
