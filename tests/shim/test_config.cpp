// Every SPILLWAY_* variable (shim/src/config.cpp): valid forms accepted,
// invalid forms refused with a message naming the variable and the value,
// unknown names refused (with a suggestion for a near miss), and the defaults.
// parse_config reads an environment array built here: the process's own
// environment is never touched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "config.h"
#include "stats.h"

using spillway::Config;
using spillway::LogLevel;
using spillway::Mode;

namespace {

constexpr uint64_t KiB = 1ull << 10, MiB = 1ull << 20, GiB = 1ull << 30, TiB = 1ull << 40;

// An environment array (NAME=VALUE strings, NULL-terminated) for parse_config.
class Env {
 public:
  Env() : Env(std::initializer_list<std::string>{}) {}
  explicit Env(std::initializer_list<std::string> vars) : vars_(vars) {
    for (std::string& v : vars_) ptrs_.push_back(v.data());
    ptrs_.push_back(nullptr);
  }
  char** get() { return ptrs_.data(); }

 private:
  std::vector<std::string> vars_;
  std::vector<char*> ptrs_;
};

struct Parsed {
  std::optional<Config> cfg;
  std::string error;
};

Parsed parse(std::initializer_list<std::string> vars) {
  Env env(vars);
  Parsed p;
  p.cfg = spillway::parse_config(env.get(), &p.error);
  return p;
}

Parsed parse_one(const std::string& name, const std::string& value) {
  return parse({name + "=" + value});
}

// Accepted: no error. Returns the config (a default one if refused, after
// recording the failure).
Config accepted(const std::string& name, const std::string& value) {
  Parsed p = parse_one(name, value);
  EXPECT_TRUE(p.cfg.has_value()) << name << "=" << value << " refused: " << p.error;
  return p.cfg.value_or(Config{});
}

// Refused with a message naming the variable, the value and what is accepted.
void refused(const std::string& name, const std::string& value, const std::string& also = "") {
  Parsed p = parse_one(name, value);
  if (p.cfg.has_value()) {
    ADD_FAILURE() << name << "='" << value << "' was accepted";
    return;
  }
  EXPECT_NE(p.error.find(name), std::string::npos) << "message: " << p.error;
  EXPECT_NE(p.error.find("'" + value + "'"), std::string::npos)
      << "value '" << value << "' not quoted in: " << p.error;
  EXPECT_NE(p.error.find("accepted"), std::string::npos) << "message: " << p.error;
  if (!also.empty()) {
    EXPECT_NE(p.error.find(also), std::string::npos) << "message: " << p.error;
  }
}

const char* const kSizeVars[] = {"SPILLWAY_GPU_BUDGET", "SPILLWAY_HOST_BUDGET"};

struct SizeCase {
  const char* text;
  uint64_t bytes;
};

const SizeCase kValidSizes[] = {
    {"40GiB", 40 * GiB},
    {"512MiB", 512 * MiB},
    {"1.5GB", 1500000000},
    {"4096", 4096},
    {"4096B", 4096},
    {"2KiB", 2 * KiB},
    {"1KB", 1000},
    {"3MB", 3000000},
    {"1TiB", TiB},
    {"2TB", 2000000000000ull},
    {"0.5GiB", 512 * MiB},
    {"1.5KiB", 1536},
    {"1073741824", GiB},
    {"80GiB", 80 * GiB},
    {"1.0", 1},
};

// Refused by both budgets.
const char* const kInvalidSizes[] = {
    "",       "-1",     "-1GiB", "-5%",  "0%",   "101%",        "100.5%", "%",    "abc",  "GiB",
    "40GB2",  "40 GiB", "40G",   "40Gi", "40XB", "40GiBs",      "1.5",    "1.5B", "0.5",  " 40GiB",
    "40GiB ", "+40GiB", "nan",   "inf",  "1e30", "20000000TiB", "40 %",   "x%",   "85%%",
};

TEST(ShimConfig, EmptyEnvironmentGivesTheDefaults) {
  Env empty{};
  for (char** env : {static_cast<char**>(nullptr), empty.get()}) {
    std::string error;
    auto c = spillway::parse_config(env, &error);
    ASSERT_TRUE(c.has_value()) << error;
    EXPECT_EQ(c->mode, Mode::kHost);
    EXPECT_FALSE(c->gpu_budget.set);
    EXPECT_FALSE(c->host_budget.set);
    EXPECT_EQ(c->min_block, 1 * MiB);
    EXPECT_EQ(c->log_level, LogLevel::kInfo);
    EXPECT_EQ(c->log_file, "");
    EXPECT_EQ(c->stats_file, "");
  }
}

TEST(ShimConfig, OtherVariablesAreIgnored) {
  Parsed p = parse({"PATH=/usr/bin", "SPILLWAY=1", "SPILLWAYMODE=bad", "spillway_mode=bad",
                    "XSPILLWAY_MODE=bad", "LD_PRELOAD=/x/libspillway.so", "SIMCUDA_JITTER=1"});
  ASSERT_TRUE(p.cfg.has_value()) << p.error;
  EXPECT_EQ(p.cfg->mode, Mode::kHost);
}

TEST(ShimConfig, SeveralVariablesTogether) {
  Parsed p =
      parse({"HOME=/root", "SPILLWAY_MODE=off", "SPILLWAY_GPU_BUDGET=40GiB",
             "SPILLWAY_HOST_BUDGET=50%", "SPILLWAY_MIN_BLOCK=2MiB", "SPILLWAY_LOG_LEVEL=debug",
             "SPILLWAY_LOG_FILE=/tmp/spillway.log", "SPILLWAY_STATS=/tmp/stats.json"});
  ASSERT_TRUE(p.cfg.has_value()) << p.error;
  EXPECT_EQ(p.cfg->mode, Mode::kOff);
  EXPECT_EQ(p.cfg->gpu_budget.bytes, 40 * GiB);
  EXPECT_DOUBLE_EQ(p.cfg->host_budget.fraction, 0.5);
  EXPECT_EQ(p.cfg->min_block, 2 * MiB);
  EXPECT_EQ(p.cfg->log_level, LogLevel::kDebug);
  EXPECT_EQ(p.cfg->log_file, "/tmp/spillway.log");
  EXPECT_EQ(p.cfg->stats_file, "/tmp/stats.json");
}

TEST(ShimConfig, ModeHostManagedAndOffAccepted) {
  EXPECT_EQ(accepted("SPILLWAY_MODE", "host").mode, Mode::kHost);
  EXPECT_EQ(accepted("SPILLWAY_MODE", "managed").mode, Mode::kManaged);
  EXPECT_EQ(accepted("SPILLWAY_MODE", "off").mode, Mode::kOff);
}

TEST(ShimConfig, ModeInvalidRefused) {
  for (const char* v : {"", "HOST", "Host", "hostx", "on", "1", "none", "managed "})
    refused("SPILLWAY_MODE", v, "host, managed or off");
}

TEST(ShimConfig, PolicyScheduleByDefaultLruOnRequestAndBadValuesRefused) {
  const Parsed none = parse({});
  ASSERT_TRUE(none.cfg.has_value()) << none.error;
  EXPECT_EQ(none.cfg->policy, spillway::Policy::kSchedule);
  EXPECT_EQ(accepted("SPILLWAY_POLICY", "lru").policy, spillway::Policy::kLru);
  EXPECT_EQ(accepted("SPILLWAY_POLICY", "schedule").policy, spillway::Policy::kSchedule);
  for (const char* v : {"", "LRU", "belady", "schedule "}) refused("SPILLWAY_POLICY", v, "or lru");
}

TEST(ShimConfig, PrefetchIsALaunchCountOnByDefault) {
  const Parsed none = parse({});
  ASSERT_TRUE(none.cfg.has_value()) << none.error;
  EXPECT_EQ(64u, none.cfg->prefetch_launches);
  EXPECT_EQ(0u, accepted("SPILLWAY_PREFETCH", "0").prefetch_launches);
  EXPECT_EQ(16u, accepted("SPILLWAY_PREFETCH", "16").prefetch_launches);
  EXPECT_EQ(1000000u, accepted("SPILLWAY_PREFETCH", "1000000").prefetch_launches);
  for (const char* v : {"", "-1", "+8", "1000001", "64 ", "8k", "1e3", "on", "99999999"})
    refused("SPILLWAY_PREFETCH", v, "a number of launches from 0 (off) to 1000000");
}

TEST(ShimConfig, StepPlansAreOnByDefaultAndTakeOnOrOff) {
  const Parsed none = parse({});
  ASSERT_TRUE(none.cfg.has_value()) << none.error;
  EXPECT_TRUE(none.cfg->plan);
  EXPECT_TRUE(accepted("SPILLWAY_PLAN", "on").plan);
  EXPECT_FALSE(accepted("SPILLWAY_PLAN", "off").plan);
  for (const char* v : {"", "1", "ON", "yes", "on "})
    refused("SPILLWAY_PLAN", v,
            "on (plan each step's evictions and prefetches from the last) or off");
}

TEST(ShimConfig, BudgetSizesAccepted) {
  for (const char* var : kSizeVars) {
    for (const SizeCase& c : kValidSizes) {
      SCOPED_TRACE(std::string(var) + "=" + c.text);
      Config cfg = accepted(var, c.text);
      const auto& s = std::string(var) == "SPILLWAY_GPU_BUDGET" ? cfg.gpu_budget : cfg.host_budget;
      EXPECT_TRUE(s.set);
      EXPECT_EQ(s.fraction, 0.0);
      EXPECT_EQ(s.bytes, c.bytes);
      EXPECT_EQ(s.resolve(80 * GiB), c.bytes);  // a size does not depend on the total
    }
  }
}

TEST(ShimConfig, BudgetPercentagesAccepted) {
  const struct {
    const char* text;
    double fraction;
  } cases[] = {{"85%", 0.85}, {"100%", 1.0}, {"0.5%", 0.005}, {"12.5%", 0.125}, {"1%", 0.01}};
  for (const char* var : kSizeVars) {
    for (const auto& c : cases) {
      SCOPED_TRACE(std::string(var) + "=" + c.text);
      Config cfg = accepted(var, c.text);
      const auto& s = std::string(var) == "SPILLWAY_GPU_BUDGET" ? cfg.gpu_budget : cfg.host_budget;
      EXPECT_TRUE(s.set);
      EXPECT_DOUBLE_EQ(s.fraction, c.fraction);
    }
  }
  EXPECT_EQ(accepted("SPILLWAY_GPU_BUDGET", "85%").gpu_budget.resolve(80 * GiB), 73014444032ull);
  EXPECT_EQ(accepted("SPILLWAY_GPU_BUDGET", "100%").gpu_budget.resolve(80 * GiB), 80 * GiB);
  EXPECT_EQ(accepted("SPILLWAY_HOST_BUDGET", "50%").host_budget.resolve(64 * GiB), 32 * GiB);
}

// SPILLWAY_HOST_RESERVE: a size, 0 for none, or a percentage of the GPU
// budget; unset, none (the runtime's default).
TEST(ShimConfig, HostReserveTakesASizeZeroOrAShareOfTheGpuBudget) {
  EXPECT_FALSE(accepted("SPILLWAY_MODE", "host").host_reserve.set);
  EXPECT_EQ(accepted("SPILLWAY_HOST_RESERVE", "8GiB").host_reserve.resolve(40 * GiB), 8 * GiB);
  EXPECT_EQ(accepted("SPILLWAY_HOST_RESERVE", "25%").host_reserve.resolve(40 * GiB), 10 * GiB);
  const auto none = accepted("SPILLWAY_HOST_RESERVE", "0").host_reserve;
  EXPECT_TRUE(none.set);
  EXPECT_EQ(0u, none.resolve(40 * GiB));
  for (const char* v : kInvalidSizes) refused("SPILLWAY_HOST_RESERVE", v, "of the GPU budget");
}

TEST(ShimConfig, BudgetInvalidFormsRefused) {
  for (const char* var : kSizeVars)
    for (const char* v : kInvalidSizes) refused(var, v, "40GiB");
}

// Sizes refuse a leading space or sign (parse_bytes), and the accepted forms
// are decimal numbers with a unit: percentages must refuse the same, and
// strtod's other spellings (hexadecimal) are not among the accepted forms.
TEST(ShimConfig, NumbersAreDecimalWithoutSignOrSpace) {
  for (const char* var : kSizeVars)
    for (const char* v : {" 85%", "+85%", "\t85%", "0x55%", "0x10", "0x1p30", "0x10GiB"})
      refused(var, v);
}

TEST(ShimConfig, GpuBudgetOfZeroRefused) {
  // "0.0001KiB" rounds down to 0 bytes.
  for (const char* v : {"0", "0B", "0GiB", "0.0", "0.0001KiB"}) refused("SPILLWAY_GPU_BUDGET", v);
}

// The host budget caps the host memory evicted blocks take (issue 3, item 4).
// A budget of zero bytes is no cap the allocator can honour (AllocatorOptions
// treats 0 as "unlimited"), and 0% is already refused: 0 must be refused too.
TEST(ShimConfig, HostBudgetOfZeroRefused) {
  for (const char* v : {"0", "0B", "0GiB", "0.0001KiB"}) refused("SPILLWAY_HOST_BUDGET", v);
}

TEST(ShimConfig, MinBlockAccepted) {
  const SizeCase cases[] = {{"4KiB", 4 * KiB}, {"4096", 4096},        {"64KiB", 64 * KiB},
                            {"1MiB", MiB},     {"0.5MiB", 512 * KiB}, {"2MiB", 2 * MiB},
                            {"1GiB", GiB},     {"1073741824", GiB},   {"4MB", 4000000}};
  for (const SizeCase& c : cases)
    EXPECT_EQ(accepted("SPILLWAY_MIN_BLOCK", c.text).min_block, c.bytes);
}

TEST(ShimConfig, MinBlockOutsideItsRangeRefused) {
  for (const char* v : {"4095", "4000", "1KiB", "0", "1073741825", "2GiB", "1.5GiB", "1TiB", "",
                        "-1MiB", "50%", "1%", "1.5", "abc", "1 MiB", "1M"})
    refused("SPILLWAY_MIN_BLOCK", v, "4KiB to 1GiB");
}

TEST(ShimConfig, LogLevelsAccepted) {
  const struct {
    const char* text;
    LogLevel level;
  } cases[] = {{"trace", LogLevel::kTrace}, {"debug", LogLevel::kDebug}, {"info", LogLevel::kInfo},
               {"warn", LogLevel::kWarn},   {"error", LogLevel::kError}, {"off", LogLevel::kOff}};
  for (const auto& c : cases) EXPECT_EQ(accepted("SPILLWAY_LOG_LEVEL", c.text).log_level, c.level);
}

TEST(ShimConfig, BadLogLevelRefused) {
  for (const char* v : {"", "INFO", "Info", "warning", "verbose", "3", "err", "debug "})
    refused("SPILLWAY_LOG_LEVEL", v, "trace, debug, info, warn, error or off");
}

TEST(ShimConfig, FilesAccepted) {
  EXPECT_EQ(accepted("SPILLWAY_LOG_FILE", "/tmp/s.log").log_file, "/tmp/s.log");
  EXPECT_EQ(accepted("SPILLWAY_LOG_FILE", "relative/s.log").log_file, "relative/s.log");
  EXPECT_EQ(accepted("SPILLWAY_STATS", "/tmp/stats.json").stats_file, "/tmp/stats.json");
  EXPECT_EQ(accepted("SPILLWAY_STATS", "stats-rank0.json").stats_file, "stats-rank0.json");
}

TEST(ShimConfig, EmptyFilesRefused) {
  refused("SPILLWAY_LOG_FILE", "", "file path");
  refused("SPILLWAY_STATS", "", "file path");
}

TEST(ShimConfig, VariableWithoutValueRefused) {
  // An environment entry without '=' has the empty value.
  Parsed p = parse({"SPILLWAY_GPU_BUDGET"});
  EXPECT_FALSE(p.cfg.has_value());
  EXPECT_NE(p.error.find("SPILLWAY_GPU_BUDGET"), std::string::npos) << p.error;
}

TEST(ShimConfig, FirstBadVariableStopsTheParse) {
  Parsed p = parse({"SPILLWAY_MODE=off", "SPILLWAY_MIN_BLOCK=1", "SPILLWAY_LOG_LEVEL=info"});
  EXPECT_FALSE(p.cfg.has_value());
  EXPECT_NE(p.error.find("SPILLWAY_MIN_BLOCK='1'"), std::string::npos) << p.error;
}

TEST(ShimConfig, MisspelledNameRefusedWithSuggestion) {
  const struct {
    const char* name;
    const char* meant;
  } cases[] = {{"SPILLWAY_GPU_BUGDET", "SPILLWAY_GPU_BUDGET"},
               {"SPILLWAY_GPU_BUDGE", "SPILLWAY_GPU_BUDGET"},
               {"SPILLWAY_HOST_BUGET", "SPILLWAY_HOST_BUDGET"},
               {"SPILLWAY_MIN_BLOK", "SPILLWAY_MIN_BLOCK"},
               {"SPILLWAY_LOGLEVEL", "SPILLWAY_LOG_LEVEL"},
               {"SPILLWAY_STAT", "SPILLWAY_STATS"},
               {"SPILLWAY_MODES", "SPILLWAY_MODE"}};
  for (const auto& c : cases) {
    Parsed p = parse_one(c.name, "40GiB");
    EXPECT_FALSE(p.cfg.has_value()) << c.name;
    EXPECT_NE(p.error.find(std::string(c.name) + "='40GiB'"), std::string::npos) << p.error;
    EXPECT_NE(p.error.find("unknown"), std::string::npos) << p.error;
    EXPECT_NE(p.error.find(std::string("did you mean ") + c.meant + "?"), std::string::npos)
        << p.error;
  }
}

TEST(ShimConfig, FarOffNameRefusedWithoutSuggestion) {
  for (const char* name :
       {"SPILLWAY_TURBO", "SPILLWAY_", "SPILLWAY_PREFETCH_DEPTH", "SPILLWAY_BUDGET_FOR_THE_GPU"}) {
    Parsed p = parse_one(name, "1");
    EXPECT_FALSE(p.cfg.has_value()) << name;
    EXPECT_NE(p.error.find(std::string(name) + "='1'"), std::string::npos) << p.error;
    EXPECT_NE(p.error.find("unknown"), std::string::npos) << p.error;
    EXPECT_EQ(p.error.find("did you mean"), std::string::npos) << p.error;
  }
}

TEST(ShimConfig, UnknownNameRefusedEvenAmongValidOnes) {
  Parsed p = parse({"SPILLWAY_GPU_BUDGET=40GiB", "SPILLWAY_GPU_BUGDET=20GiB"});
  EXPECT_FALSE(p.cfg.has_value());
  EXPECT_NE(p.error.find("did you mean SPILLWAY_GPU_BUDGET?"), std::string::npos) << p.error;
}

TEST(ShimConfig, DefaultGpuBudgetLeavesTheLargerOf1GiBAnd5Percent) {
  // 5% is the larger headroom from 20 GiB up.
  EXPECT_EQ(spillway::default_gpu_budget(80 * GiB), 76 * GiB);
  EXPECT_EQ(spillway::default_gpu_budget(40 * GiB), 38 * GiB);
  EXPECT_EQ(spillway::default_gpu_budget(20 * GiB), 19 * GiB);
  EXPECT_EQ(spillway::default_gpu_budget(24 * GiB), 24 * GiB - 24 * GiB / 20);
  // Below 20 GiB, 1 GiB is.
  EXPECT_EQ(spillway::default_gpu_budget(16 * GiB), 15 * GiB);
  EXPECT_EQ(spillway::default_gpu_budget(2 * GiB), 1 * GiB);
  // A device of 1 GiB or less keeps half.
  EXPECT_EQ(spillway::default_gpu_budget(1 * GiB), 512 * MiB);
  EXPECT_EQ(spillway::default_gpu_budget(512 * MiB), 256 * MiB);
  for (uint64_t total = 1 * GiB + 1; total < 200 * GiB; total += 3 * GiB + 12345) {
    const uint64_t headroom = std::max<uint64_t>(GiB, total / 20);
    EXPECT_EQ(spillway::default_gpu_budget(total), total - headroom) << total;
  }
}

TEST(ShimConfig, DefaultHostBudgetIsHalfOfHostMemory) {
  EXPECT_EQ(spillway::default_host_budget(64 * GiB), 32 * GiB);
  EXPECT_EQ(spillway::default_host_budget(1 * TiB), 512 * GiB);
  EXPECT_EQ(spillway::default_host_budget(3), 1u);
  EXPECT_EQ(spillway::default_host_budget(0), 0u);
}

TEST(ShimConfig, ParseBytesDirectly) {
  EXPECT_EQ(spillway::parse_bytes("40GiB"), 40 * GiB);
  EXPECT_EQ(spillway::parse_bytes("0"), 0u);
  EXPECT_EQ(spillway::parse_bytes("1.5"), std::nullopt);
  EXPECT_EQ(spillway::parse_bytes("85%"), std::nullopt);  // a percentage is not a size
  EXPECT_EQ(spillway::parse_bytes("16TiB"), 16 * TiB);
  EXPECT_EQ(spillway::parse_bytes("-0"), std::nullopt);
}

// Found by fuzz_size (fuzz/corpus/size/crash-*, docs/reliability.md): a
// fraction times its unit went through a double, which rounded 1.001KB down
// to 1000 bytes and 70.0000009107TB one byte short. docs/config.md: rounded
// down to whole bytes, from the exact value.
TEST(ShimConfig, SizesAreRoundedDownFromTheirExactValue) {
  EXPECT_EQ(spillway::parse_bytes("1.001KB"), 1001u);
  EXPECT_EQ(spillway::parse_bytes("1.003KB"), 1003u);
  EXPECT_EQ(spillway::parse_bytes("70.0000009107TB"), 70000000910700u);
  EXPECT_EQ(spillway::parse_bytes("0.3GB"), 300000000u);
  EXPECT_EQ(spillway::parse_bytes("0.0009765625KiB"), 1u);  // 2^-10 KiB
  EXPECT_EQ(spillway::parse_bytes("0.0009765624KiB"), 0u);
  EXPECT_EQ(spillway::parse_bytes("1.99999999999999999999999B"), std::nullopt);
  EXPECT_EQ(spillway::parse_bytes("2.000000000000000000000000"), 2u);
  EXPECT_EQ(spillway::parse_bytes("000000000000000000000000000001KiB"), 1024u);
  // Up to just under 1.8e19 bytes, exactly.
  EXPECT_EQ(spillway::parse_bytes("17999999999999999999"), 17999999999999999999u);
  EXPECT_EQ(spillway::parse_bytes("18000000000000000000"), std::nullopt);
  EXPECT_EQ(spillway::parse_bytes("16370904.631912708282470703124TiB"), 17999999999999999999u);
  EXPECT_EQ(spillway::parse_bytes("16370904.631912708282470703125TiB"), std::nullopt);
  EXPECT_EQ(spillway::parse_bytes("18446744073709551616"), std::nullopt);
  EXPECT_EQ(spillway::parse_bytes("11111111111111111111"), 11111111111111111111u);
  EXPECT_EQ(spillway::parse_bytes(std::string(400, '1')), std::nullopt);
  EXPECT_EQ(spillway::parse_bytes(std::string(400, '1') + "KiB"), std::nullopt);
}

TEST(ShimConfig, FormatBytesIsWhatAPersonReads) {
  EXPECT_EQ(spillway::format_bytes(0), "0 B");
  EXPECT_EQ(spillway::format_bytes(1023), "1023 B");
  EXPECT_EQ(spillway::format_bytes(1024), "1.0 KiB");
  EXPECT_EQ(spillway::format_bytes(12 * 1024 * 1024 + 300 * 1024), "12.3 MiB");
  EXPECT_EQ(spillway::format_bytes(40 * GiB), "40.0 GiB");
  EXPECT_EQ(spillway::format_bytes(3 * TiB / 2), "1.5 TiB");
  EXPECT_EQ(spillway::format_bytes(UINT64_MAX), "16384.0 PiB");
  // What it prints, the size parser reads back.
  EXPECT_EQ(spillway::parse_bytes("40.0GiB"), 40 * GiB);
}

TEST(ShimConfig, EditDistance) {
  EXPECT_EQ(spillway::edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(spillway::edit_distance("", "abc"), 3u);
  EXPECT_EQ(spillway::edit_distance("abc", ""), 3u);
  EXPECT_EQ(spillway::edit_distance("SPILLWAY_MODE", "SPILLWAY_MODE"), 0u);
  EXPECT_EQ(spillway::edit_distance("SPILLWAY_GPU_BUGDET", "SPILLWAY_GPU_BUDGET"), 2u);
}

std::string read_source(const std::string& relative) {
  std::ifstream in(std::string(SPILLWAY_SOURCE_DIR) + "/" + relative);
  EXPECT_TRUE(in.good()) << relative;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// docs/config.md lists every variable config.cpp reads...
TEST(ShimDocs, EveryVariableIsDocumented) {
  const std::string code = read_source("shim/src/config.cpp");
  const std::string doc = read_source("docs/config.md");
  const std::regex entry(R"re(\{"(SPILLWAY_[A-Z_]+)",)re");
  size_t n = 0;
  for (std::sregex_iterator it(code.begin(), code.end(), entry), end; it != end; ++it, ++n) {
    const std::string name = (*it)[1];
    EXPECT_NE(doc.find("| `" + name + "` |"), std::string::npos) << name << " is not in the table";
    // ...and the parser knows it (not refused as an unknown name).
    Parsed p = parse_one(name, "");
    EXPECT_EQ(p.error.find("unknown"), std::string::npos) << p.error;
  }
  EXPECT_GE(n, 7u) << "the variable table of config.cpp was not found";
}

// Issue 15 item 3: every variable, with values a user could mistype, is
// refused by name (the variable, the value quoted, what is accepted). A
// variable added to config.cpp without a row here fails this test.
TEST(ShimConfig, EveryVariableRefusesWrongValuesByName) {
  const std::map<std::string, std::vector<std::string>> wrong = {
      {"SPILLWAY_MODE", {"", "Host", "evict", "on"}},
      {"SPILLWAY_GPU_BUDGET",
       {"", "0", "-1GiB", "40 GiB", "40GB!", "abc", "1e3", "0%", "101%", "0.00009%",
        // fuzz_config found it: a share that resolved to 0 bytes, taken for no budget
        "000000000000.0000000000000000000000000001000000000000085%"}},
      {"SPILLWAY_HOST_BUDGET", {"", "0", "lots", "1.5.2GiB", "99999999999999999999"}},
      {"SPILLWAY_HOST_RESERVE", {"", "-1", "half", "1000%", "8 GiB"}},
      {"SPILLWAY_MIN_BLOCK", {"", "0", "1TiB", "small"}},
      {"SPILLWAY_POLICY", {"", "LRU", "fifo"}},
      {"SPILLWAY_PREFETCH", {"", "-4", "many", "on"}},
      {"SPILLWAY_LOG_LEVEL", {"", "verbose", "INFO5"}},
      {"SPILLWAY_LOG_FILE", {""}},
      {"SPILLWAY_STATS", {""}},
      {"SPILLWAY_TRACE", {""}},
      {"SPILLWAY_RECORD", {""}},
      {"SPILLWAY_STACKS", {"", "yes", "2"}},
      {"SPILLWAY_PLAN", {"", "1", "auto"}},
      {"SPILLWAY_CUPTI", {"", "maybe"}},
      {"SPILLWAY_CUPTI_PATH", {""}},
  };
  const std::string code = read_source("shim/src/config.cpp");
  const std::regex entry(R"re(\{"(SPILLWAY_[A-Z_]+)",)re");
  size_t n = 0;
  for (std::sregex_iterator it(code.begin(), code.end(), entry), end; it != end; ++it, ++n) {
    const std::string name = (*it)[1];
    auto row = wrong.find(name);
    if (row == wrong.end()) {
      ADD_FAILURE() << name << " has no wrong values in this test";
      continue;
    }
    for (const std::string& v : row->second) {
      SCOPED_TRACE(name + "='" + v + "'");
      refused(name, v);
    }
  }
  EXPECT_EQ(n, wrong.size()) << "a variable of this table is no longer in config.cpp";
}

// ...and every key of the statistics JSON.
TEST(ShimDocs, EveryStatisticsKeyIsDocumented) {
  const std::string json = spillway::to_json(spillway::Stats{}, 0);
  const std::string doc = read_source("docs/config.md");
  const std::regex key(R"re("([a-z_]+)":)re");
  size_t n = 0;
  for (std::sregex_iterator it(json.begin(), json.end(), key), end; it != end; ++it, ++n) {
    const std::string name = (*it)[1];
    EXPECT_NE(doc.find("`" + name + "`"), std::string::npos) << name << " is not documented";
  }
  EXPECT_GE(n, 20u) << json;
}

}  // namespace

// Runtime::stats adds the devices' figures with add_device: counts and
// levels are summed, a setting every device shares is taken as it is.
TEST(Stats, DevicesAreSummedAndSharedSettingsKept) {
  spillway::Stats a, b, sum;
  a.bytes_evicted = 3;
  b.bytes_evicted = 4;
  a.peak_resident_bytes = 10;
  b.peak_resident_bytes = 20;
  a.host_budget_bytes = b.host_budget_bytes = 64;
  spillway::add_device(&sum, a);
  spillway::add_device(&sum, b);
  EXPECT_EQ(7u, sum.bytes_evicted);
  EXPECT_EQ(30u, sum.peak_resident_bytes);
  EXPECT_EQ(64u, sum.host_budget_bytes);
  const std::string json = spillway::to_json(sum, 2);
  EXPECT_NE(json.find("\"bytes_evicted\": 7,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"steps\": 2,"), std::string::npos) << json;
}

TEST(Config, TraceRecordAndStacksAreParsedAndBadValuesRefused) {
  EXPECT_EQ(accepted("SPILLWAY_TRACE", "run.json").trace_file, "run.json");
  EXPECT_EQ(accepted("SPILLWAY_RECORD", "job.spwt").record_file, "job.spwt");
  EXPECT_TRUE(accepted("SPILLWAY_STACKS", "1").stacks);
  EXPECT_FALSE(accepted("SPILLWAY_STACKS", "0").stacks);
  refused("SPILLWAY_TRACE", "", "file path");
  refused("SPILLWAY_RECORD", "", "file path");
  refused("SPILLWAY_STACKS", "yes", "1");
}

TEST(Config, LogLinesNameTheRankAndPidOnlyInAJob) {
  std::vector<std::string> vars = {"RANK=3", "LOCAL_RANK=1"};
  char* ranked[] = {vars[0].data(), vars[1].data(), nullptr};
  EXPECT_EQ("rank 3 pid " + std::to_string(getpid()), spillway::log_tag(ranked));
  char* local[] = {vars[1].data(), nullptr};
  EXPECT_EQ("rank 1 pid " + std::to_string(getpid()), spillway::log_tag(local));
  char* none[] = {nullptr};
  EXPECT_EQ("", spillway::log_tag(none));
}

TEST(Config, RankAndPidAreExpandedInFilePaths) {
  std::vector<std::string> vars = {"RANK=3", "SPILLWAY_STATS=stats-{rank}.json",
                                   "SPILLWAY_TRACE=t{rank}-{pid}.json"};
  std::vector<char*> env;
  for (auto& v : vars) env.push_back(v.data());
  env.push_back(nullptr);
  std::string error;
  auto c = spillway::parse_config(env.data(), &error);
  ASSERT_TRUE(c) << error;
  EXPECT_EQ("stats-3.json", c->stats_file);
  EXPECT_EQ("t3-" + std::to_string(getpid()) + ".json", c->trace_file);
  std::vector<std::string> local = {"LOCAL_RANK=5"};
  char* env2[] = {local[0].data(), nullptr};
  EXPECT_EQ("a5{ran}", spillway::expand_path("a{rank}{ran}", env2));
  char* none[] = {nullptr};
  EXPECT_EQ("s0.json", spillway::expand_path("s{rank}.json", none));
}
