// The counters spillway reports: at exit (one summary line, SPILLWAY_STATS),
// and on demand (spillway_stats_json). The fields are listed once, in
// stats_fields.def.
#pragma once

#include <cstdint>
#include <string>

namespace spillway {

struct Stats {
#define SPILLWAY_STAT(name, combine, meaning) uint64_t name = 0;
#include "stats_fields.def"
#undef SPILLWAY_STAT
};

// Adds one device's figures to a process's (stats_fields.def says how).
void add_device(Stats* sum, const Stats& device);
std::string to_json(const Stats& s, uint64_t steps);
// One line for the end of a run.
std::string summary_line(const Stats& s);
// One line for the end of a step: what moved since the figures `before`
// (those at the last step mark) and the time the job waited for it.
std::string step_line(const Stats& now, const Stats& before);

}  // namespace spillway
