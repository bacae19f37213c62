// Fuzz target: the simulated GPU's configuration (sim/src/config.*), every
// SIMCUDA_* variable at once. The input is an environment image as
// /proc/PID/environ holds one: NAME=value strings, each ended by a NUL. The
// sim reads its variables with getenv() and walks `environ` for unknown
// names, so the image becomes `environ` for the call (no setenv(): glibc
// keeps every value it was given) and the process's own comes back after.
// Besides crashes, leaks and undefined behaviour it checks that a refusal is
// one line naming a SIMCUDA_ variable, and that what is accepted is in the
// ranges docs/sim.md gives; then SIMCUDA_FAIL's items are parsed as cuInit
// parses them, and a refusal of them must be one line too.
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config.h"
#include "faults.h"
#include "environ_image.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  EnvironImage image(data, size);

  char** const own = environ;
  environ = image.env.data();
  std::string error;
  const auto c = sim::load_config(&error);
  environ = own;

  if (!c) {
    FUZZ_CHECK(error.rfind("simcuda: ", 0) == 0, "refusal '%s'", error.c_str());
    FUZZ_CHECK(error.find("SIMCUDA_") != std::string::npos, "refusal names nothing: '%s'",
               error.c_str());
    FUZZ_CHECK(error.find('\n') == std::string::npos, "refusal of several lines: '%s'",
               error.c_str());
    return 0;
  }
  FUZZ_CHECK(c->device_count >= 1 && c->device_count <= 8, "device count %d", c->device_count);
  FUZZ_CHECK(c->device_memory >= 1 && c->host_memory >= 1, "memory %llu / %llu",
             static_cast<unsigned long long>(c->device_memory),
             static_cast<unsigned long long>(c->host_memory));
  FUZZ_CHECK(c->granularity >= 4096 && (c->granularity & (c->granularity - 1)) == 0,
             "granularity %llu", static_cast<unsigned long long>(c->granularity));
  for (const double r : {c->h2d_bytes_per_ns, c->d2h_bytes_per_ns, c->bidir_bytes_per_ns,
                         c->hbm_bytes_per_ns, c->fault_bytes_per_ns})
    FUZZ_CHECK(r > 0 && std::isfinite(r), "rate %g", r);
  FUZZ_CHECK(c->host_create_bytes_per_ns >= 0 && std::isfinite(c->host_create_bytes_per_ns),
             "host create rate %g", c->host_create_bytes_per_ns);
  FUZZ_CHECK(c->api_ns <= 1000000000 && c->launch_ns <= 1000000000, "api %llu launch %llu",
             static_cast<unsigned long long>(c->api_ns),
             static_cast<unsigned long long>(c->launch_ns));
  FUZZ_CHECK(!c->vmm_ns || *c->vmm_ns <= 1000000000, "vmm %llu",
             static_cast<unsigned long long>(*c->vmm_ns));
  for (const auto& [name, ns] : c->call_ns) {
    FUZZ_CHECK(!name.empty() && name.find(',') == std::string::npos, "call name '%s'",
               name.c_str());
    FUZZ_CHECK(ns <= 1000000000, "%s: %llu ns", name.c_str(), static_cast<unsigned long long>(ns));
  }
  FUZZ_CHECK(c->jitter_max_us >= 1 && c->jitter_max_us <= 1000000, "jitter max %llu",
             static_cast<unsigned long long>(c->jitter_max_us));
  // SIMCUDA_FAIL's items, as cuInit reads them after the rest.
  if (!sim::faults::configure(c->fail_spec, &error)) {
    FUZZ_CHECK(error.rfind("simcuda: SIMCUDA_FAIL=", 0) == 0, "refusal '%s'", error.c_str());
    FUZZ_CHECK(error.find('\n') == std::string::npos, "refusal of several lines: '%s'",
               error.c_str());
  }
  sim::faults::clear();
  return 0;
}
