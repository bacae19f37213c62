#include "events.h"

#include <ctime>

namespace spillway {

const char* cause_name(Cause c) {
  switch (c) {
    case Cause::kBudget:
      return "budget";
    case Cause::kPressure:
      return "pressure";
    case Cause::kPrefetch:
      return "prefetch";
    case Cause::kOnDemand:
      return "on-demand";
  }
  return "unknown";
}

uint64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace spillway
