// The counters spillway reports: at exit (one summary line, SPILLWAY_STATS),
// and on demand (spillway_stats_json).
#pragma once

#include <cstdint>
#include <string>

namespace spillway {

struct Stats {
  uint64_t blind = 0;  // 1: no access tracking (no CUPTI, or another subscriber)
  uint64_t budget_bytes = 0;
  uint64_t host_budget_bytes = 0;
  uint64_t resident_bytes = 0;  // device physical memory held now
  uint64_t peak_resident_bytes = 0;
  uint64_t live_bytes = 0;  // bytes requested by live allocations
  uint64_t peak_live_bytes = 0;
  uint64_t reserved_bytes = 0;    // device + host memory behind live and cached blocks
  uint64_t small_pool_bytes = 0;  // chunks for blocks below SPILLWAY_MIN_BLOCK
  uint64_t host_bytes = 0;        // host physical memory held now
  uint64_t peak_host_bytes = 0;
  uint64_t mallocs = 0, frees = 0, cache_hits = 0;
  uint64_t bad_frees = 0;  // unknown pointer, double free, size mismatch
  uint64_t ooms = 0;       // malloc returned NULL
  uint64_t blocks_evicted = 0, blocks_restored = 0;
  uint64_t bytes_evicted = 0, bytes_restored = 0;
  uint64_t evictions_failed = 0;                  // attempted and rolled back
  uint64_t evictions_cancelled = 0;               // used or freed while the copy was in flight
  uint64_t background_batches = 0;                // eviction batches run ahead of need
  uint64_t device_creates = 0, host_creates = 0;  // cuMemCreate calls
  uint64_t cached_releases = 0;                   // free cached blocks unmapped under pressure
};

std::string to_json(const Stats& s, uint64_t steps);
// One line for the end of a run.
std::string summary_line(const Stats& s);

}  // namespace spillway
