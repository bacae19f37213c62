// SIMCUDA_* environment variables: the simulated machine's shape and costs.
// Read once at cuInit (and again by simcuda_reset-style tests through a new
// process). Defaults model an H100 SXM on PCIe Gen5, see docs/sim.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sim {

struct Config {
  int device_count = 1;
  uint64_t device_memory = 80ull << 30;  // H100 SXM: 80 GB HBM3
  uint64_t host_memory = 1ull << 40;     // pinned + host-located VMM memory cap
  uint64_t granularity = 2ull << 20;     // cuMemGetAllocationGranularity, both options
  double h2d_bytes_per_ns = 55.0;        // 55 GB/s, pinned, one direction at a time
  double d2h_bytes_per_ns = 55.0;
  double bidir_bytes_per_ns = 45.0;  // each direction while both run (assumption)
  double hbm_bytes_per_ns = 3000.0;  // ~3 TB/s
  uint64_t api_ns = 500;             // host cost of a driver call
  uint64_t launch_ns = 4000;         // host cost of a kernel launch
  // Per-entry-point host costs (assumptions, docs/sim.md). SIMCUDA_VMM_NS
  // sets cuMemMap, cuMemUnmap, cuMemSetAccess, cuMemCreate and cuMemRelease;
  // SIMCUDA_CALL_NS=name:ns,... names entry points (exported or base names,
  // matched as SIMCUDA_FAIL matches them) and wins over it, a later item over
  // an earlier one. The names are checked against the entry points at cuInit.
  std::optional<uint64_t> vmm_ns;
  std::vector<std::pair<std::string, uint64_t>> call_ns;  // in the order given
  std::string call_ns_spec;                               // SIMCUDA_CALL_NS as given
  uint64_t jitter_seed = 0;                               // 0: no jitter
  uint64_t jitter_max_us = 200;
  // Managed memory a kernel migrates on first access moves in small batches,
  // each after a fault round trip: well below a prefetch's rate (assumption).
  double fault_bytes_per_ns = 20.0;  // SIMCUDA_FAULT_GBPS
  // Creating host-located memory pins and clears its pages: its host cost
  // grows with the size (an H200 created it at 3.2 GB/s, docs/gpu.md check
  // (e)). 0: free, as before (SIMCUDA_HOST_CREATE_GBPS unset).
  double host_create_bytes_per_ns = 0.0;
  bool host_numa_vmm = true;  // CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
  bool concurrent_managed = true;
  // SIMCUDA_DATA=0: copies and memsets are checked, timed and reported as
  // usual but move no byte, so replaying a large trace in accounting mode
  // needs no host RAM for what it evicts (the memfd pages stay holes).
  bool move_data = true;
  std::string fail_spec;  // SIMCUDA_FAIL
  bool log = false;       // SIMCUDA_LOG=1: the sim explains every refused call on stderr
};

// Parses the environment. On a bad value returns nullopt and sets `error`
// to a message naming the variable, the value and the accepted forms.
std::optional<Config> load_config(std::string* error);

// "80GiB", "512MiB", "1.5GB", "4096" -> bytes. Exposed for tests.
std::optional<uint64_t> parse_size(const std::string& text);

// "500", "500ns", "20us", "1ms" -> nanoseconds (an integer, at most 1 s).
// Exposed for tests.
std::optional<uint64_t> parse_ns(const std::string& text);
// The accepted forms of a SIMCUDA_CALL_NS value, for error messages.
extern const char* const kCallNsForms;

// A decimal integer of digits only (no sign, no blank), at most 2^64 - 1.
std::optional<uint64_t> parse_uint(const std::string& text);

// A value as a refusal quotes it: control characters escaped as \xNN, so
// that the refusal stays one line.
std::string shown(const std::string& v);

}  // namespace sim
