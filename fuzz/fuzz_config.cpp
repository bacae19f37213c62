// Fuzz target: the whole environment configuration (shim/src/config.*). The
// input is an environment image as /proc/PID/environ holds one: NAME=value
// strings, each ended by a NUL. parse_config() reads that set of variables
// (every SPILLWAY_* one, and RANK / LOCAL_RANK for the {rank} of a path)
// through the char** it is given; the process's own environment is not
// touched. Besides crashes, leaks and undefined behaviour it checks that a
// refusal is one line naming a variable, and that what is accepted is in the
// ranges docs/config.md gives.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config.h"
#include "environ_image.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  EnvironImage image(data, size);

  std::string error;
  const auto config = spillway::parse_config(image.env.data(), &error);
  if (!config) {
    FUZZ_CHECK(error.rfind("spillway: ", 0) == 0, "refusal '%s'", error.c_str());
    FUZZ_CHECK(error.find("SPILLWAY_") != std::string::npos, "refusal names nothing: '%s'",
               error.c_str());
    return 0;
  }
  const spillway::Config& c = *config;
  FUZZ_CHECK(c.min_block >= 4096 && c.min_block <= (UINT64_C(1) << 30), "min_block %llu",
             static_cast<unsigned long long>(c.min_block));
  FUZZ_CHECK(c.prefetch_launches <= 1000000, "prefetch %u", c.prefetch_launches);
  constexpr uint64_t kTotal = UINT64_C(80) << 30;
  if (c.gpu_budget.set) FUZZ_CHECK(c.gpu_budget.resolve(kTotal) > 0, "a GPU budget of 0 bytes");
  if (c.host_budget.set) FUZZ_CHECK(c.host_budget.resolve(kTotal) > 0, "a host budget of 0 bytes");
  (void)c.host_reserve.resolve(kTotal);
  (void)spillway::default_gpu_budget(kTotal);
  (void)spillway::log_tag(image.env.data());
  return 0;
}
