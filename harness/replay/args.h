// The replayer's command line and the little JSON it reads back (its
// baseline child's report, the shim's statistics): apart from main() so that
// the tests and the fuzz target (fuzz/replay_args.cpp) can call them. Nothing
// here prints or exits.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "replay.h"

namespace replay {

// A size as docs/config.md defines it: decimal number, optional unit.
std::optional<uint64_t> parse_size(const std::string& s);

// What the command line asks for (CLI11). --help or --version anywhere
// wins: kHelp, kVersion. Else the options are read in order and the first
// bad one ends the reading: kBad with `error` (the line bad_usage prints).
// kRun: `options` is complete except `shim` when --shim was not given (main
// fills it). `help` is every option's description, in any case.
struct Args {
  enum class Action { kRun, kHelp, kVersion, kBad };
  Action action = Action::kRun;
  Options options;
  std::string error;
  std::string help;
};
Args parse_args(int argc, const char* const* argv);

// --budget SIZE or PCT% (of `unconstrained_peak`, rounded down) in bytes;
// nullopt with `error` set when it is neither, or 0 bytes.
std::optional<uint64_t> parse_budget(const std::string& budget, uint64_t unconstrained_peak,
                                     std::string* error);

// An unsigned integer of a JSON object's (the shim's statistics, the child's
// report) top level (nlohmann-json), or `dflt` when the text is not a JSON
// object, has no such key, or its value is not an integer from 0 to 2^64 - 1.
uint64_t json_u64(const std::string& json, const std::string& key, uint64_t dflt = 0);
// The unsigned integers of the array at `key` of a JSON object's top level,
// up to the first element that is not one; empty without it.
std::vector<uint64_t> json_array(const std::string& json, const std::string& key);

}  // namespace replay
