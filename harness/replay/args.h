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

// What the command line asks for. The arguments are read in order and the
// first --help, --version or bad argument ends the reading: kHelp, kVersion,
// or kBad with `error` (the line bad_usage prints). kRun: `options` is
// complete except `shim` when --shim was not given (main fills it).
struct Args {
  enum class Action { kRun, kHelp, kVersion, kBad };
  Action action = Action::kRun;
  Options options;
  std::string error;
};
Args parse_args(int argc, const char* const* argv);

// --budget SIZE or PCT% (of `unconstrained_peak`, rounded down) in bytes;
// nullopt with `error` set when it is neither, or 0 bytes.
std::optional<uint64_t> parse_budget(const std::string& budget, uint64_t unconstrained_peak,
                                     std::string* error);

// An unsigned integer from a flat JSON object (the shim's statistics, the
// child's report): the digits after the first "key": (and any spaces), or
// `dflt` when there is no such key, no digits there, or more than 2^64 - 1.
uint64_t json_u64(const std::string& json, const std::string& key, uint64_t dflt = 0);
// The unsigned integers of the array after the first "key":, up to its ']'
// or the first element that is not one; empty without the key.
std::vector<uint64_t> json_array(const std::string& json, const std::string& key);

}  // namespace replay
