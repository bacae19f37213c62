// CUresult names come from the toolkit's own cuda.h (generated at configure
// time into cuda_errors.inc), so the sim knows every code the header does.
#include <string_view>

#include "faults.h"

namespace sim::errors {
namespace {

struct Entry {
  CUresult code;
  const char* name;
  const char* description;
};

#define SIM_ERROR(sym, text) {sym, #sym, text},
constexpr Entry kErrors[] = {
#include "cuda_errors.inc"
};
#undef SIM_ERROR

}  // namespace

const char* name(CUresult e) {
  for (const Entry& x : kErrors)
    if (x.code == e) return x.name;
  return nullptr;
}

const char* description(CUresult e) {
  for (const Entry& x : kErrors)
    if (x.code == e) return x.description;
  return nullptr;
}

bool from_name(std::string_view n, CUresult* out) {
  for (const Entry& x : kErrors) {
    if (n == x.name) {
      *out = x.code;
      return true;
    }
  }
  return false;
}

}  // namespace sim::errors
