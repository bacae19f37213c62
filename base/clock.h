// The host clock every event is stamped with: CLOCK_MONOTONIC, in ns, the
// clock the Chrome trace aligns CUPTI's device timestamps to.
#pragma once

#include <time.h>

#include <cstdint>

namespace spillway {

inline uint64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace spillway
