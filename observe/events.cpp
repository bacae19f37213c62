#include "events.h"

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

}  // namespace spillway
