// Every SPILLWAY_* environment variable, parsed and validated in one place.
// Read once, when the allocator is first used. A bad value or an unknown
// SPILLWAY_ name is refused with a message that names the variable, the value
// and the accepted forms (and the likely intended name for a misspelling).
// docs/config.md lists every variable.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "log.h"
#include "size.h"

namespace spillway {

enum class Mode { kHost, kManaged, kOff };
enum class Policy { kSchedule, kLru };

struct Config {
  Mode mode = Mode::kHost;
  SizeSpec gpu_budget;   // unset: device memory less the default headroom
  SizeSpec host_budget;  // unset: half of physical host memory
  // SPILLWAY_HOST_RESERVE: host memory created ahead of evictions once the
  // GPU budget is crossed (a percentage is of the GPU budget); unset: none.
  // Within the host budget.
  SizeSpec host_reserve;
  uint64_t min_block = 1ull << 20;
  Policy policy = Policy::kSchedule;  // SPILLWAY_POLICY
  // SPILLWAY_PREFETCH: an evicted block the learned schedule predicts to be
  // used within this many launches is brought back now (0: off).
  uint32_t prefetch_launches = 64;
  // SPILLWAY_PLAN: at each step mark, plan the next step's evictions and
  // prefetches from the learned one (policy/planner.h) and carry them out
  // (off: the learned schedule's window alone).
  bool plan = true;
  LogLevel log_level = LogLevel::kInfo;
  std::string log_file;     // empty: stderr
  std::string stats_file;   // SPILLWAY_STATS
  std::string trace_file;   // SPILLWAY_TRACE: Chrome trace JSON
  std::string record_file;  // SPILLWAY_RECORD: a replayable .spwt record
  bool stacks = false;      // SPILLWAY_STACKS=1: call sites of large allocations
  bool cupti = true;        // SPILLWAY_CUPTI=auto (true) | off
  std::string cupti_path;   // empty: libcupti.so.13 from the library path
};

// Default headroom left to the CUDA context, libraries and other processes
// when SPILLWAY_GPU_BUDGET is unset: the larger of 1 GiB and 5% of the device.
uint64_t default_gpu_budget(uint64_t device_total);
uint64_t default_host_budget(uint64_t host_total);

// A file path from the configuration with `{rank}` replaced by the
// process's rank (RANK, else LOCAL_RANK, else 0: what torchrun sets) and
// `{pid}` by its process id, so that every rank of a job writes its own file.
// "rank R pid P" when the process is one rank of a job (RANK or LOCAL_RANK
// set, as torchrun does), else "": what follows the level in log lines.
std::string log_tag(char** env);
std::string expand_path(const std::string& path, char** env);

// Parses `environ`. On error returns nullopt and a one-line message.
std::optional<Config> parse_config(char** env, std::string* error);

// Exposed for tests.
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace spillway
