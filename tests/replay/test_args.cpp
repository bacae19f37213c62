// spillway-replay's parsing in-process (harness/replay/args.*, analysis.cpp):
// the command line, the JSON it reads back and the trace's meta. A test
// whose comment starts "Found" holds a bug's input (fuzz/corpus/*/crash-*,
// docs/reliability.md) or its nearest neighbour, and failed before its fix.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "args.h"
#include "replay.h"
#include "trace/trace.h"

namespace {

namespace fs = std::filesystem;
using replay::Args;

Args parse(std::vector<std::string> args) {
  args.insert(args.begin(), "spillway-replay");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);
  return replay::parse_args(static_cast<int>(args.size()), argv.data());
}

// A trace file in the test's temporary folder, removed with the test.
class TraceFile : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (fs::temp_directory_path() /
             ("replay_args_" + std::to_string(getpid()) + "_" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".spwt"))
                .string();
  }
  void TearDown() override { fs::remove(path_); }
  std::string path_;
};

TEST(ReplayArgs, ParsesTheOptionsAndStopsAtTheFirstProblem) {
  Args r = parse({"job.spwt", "--budget", "60%", "--steps", "3", "--layers", "12", "--strategy",
                  "layerwise", "--no-data"});
  ASSERT_EQ(r.action, Args::Action::kRun) << r.error;
  EXPECT_EQ(r.options.trace, "job.spwt");
  EXPECT_EQ(r.options.budget, "60%");
  EXPECT_EQ(r.options.steps, 3);
  EXPECT_EQ(r.options.layers, 12);
  EXPECT_TRUE(r.options.no_data);
  EXPECT_EQ(r.options.strategy, replay::Strategy::kLayerwise);
  EXPECT_EQ(r.options.devices, 1);
  EXPECT_EQ(parse({"job.spwt", "--devices", "3"}).options.devices, 3);
  EXPECT_FALSE(r.options.step_sync_context);
  EXPECT_FALSE(parse({"job.spwt", "--step-sync", "streams"}).options.step_sync_context);
  EXPECT_TRUE(parse({"job.spwt", "--step-sync", "context"}).options.step_sync_context);
  // "--steps 0" is every step, as --help says, not none.
  EXPECT_EQ(parse({"job.spwt", "--steps", "0"}).options.steps, parse({"job.spwt"}).options.steps);
  EXPECT_LT(parse({"job.spwt", "--steps", "0"}).options.steps, 0);
  // --help and --version win wherever they are; else the first bad value.
  EXPECT_EQ(parse({"--help", "--steps", "x"}).action, Args::Action::kHelp);
  EXPECT_EQ(parse({"--steps", "x", "--help"}).action, Args::Action::kHelp);
  EXPECT_EQ(parse({"--steps", "x", "--version"}).action, Args::Action::kVersion);
  r = parse({"--steps", "x", "--mode", "y"});
  EXPECT_EQ(r.action, Args::Action::kBad);
  EXPECT_EQ(r.error, "--steps 'x' is not an integer >= 0");
  EXPECT_EQ(parse({"--mode", "y", "--steps", "x"}).error, "--mode 'y' is not host, managed or off");
  EXPECT_EQ(parse({"--json"}).error, "--json needs a value");
  EXPECT_EQ(parse({}).error, "no record given");
}

// Issue 15 item 3: every option with the values a user could get wrong,
// each refused with words that name the option and the value
// (docs/reliability.md, "Bad input refused by name", has this table).
TEST(ReplayArgs, EveryOptionRefusesWrongValuesByName) {
  struct Case {
    std::vector<std::string> args;
    std::string error;
  };
  const std::vector<Case> cases = {
      {{"job.spwt", "--budget"}, "--budget needs a value"},
      {{"job.spwt", "--budget", ""}, "--budget is empty"},
      {{"job.spwt", "--device-memory", "1.5"}, "--device-memory '1.5' is not a size such as 80GiB"},
      {{"job.spwt", "--device-memory", "-1GiB"},
       "--device-memory '-1GiB' is not a size such as 80GiB"},
      {{"job.spwt", "--device-memory", "0"}, "--device-memory '0' is not a size such as 80GiB"},
      {{"job.spwt", "--device-memory", "80 GiB"},
       "--device-memory '80 GiB' is not a size such as 80GiB"},
      {{"job.spwt", "--mode", "unified"}, "--mode 'unified' is not host, managed or off"},
      {{"job.spwt", "--mode", "Host"}, "--mode 'Host' is not host, managed or off"},
      {{"job.spwt", "--step-sync", "device"}, "--step-sync 'device' is not streams or context"},
      {{"job.spwt", "--step-sync", ""}, "--step-sync '' is not streams or context"},
      {{"job.spwt", "--strategy", "magic"},
       "--strategy 'magic' is not spillway, none, save_on_cpu, torchtune or layerwise"},
      {{"job.spwt", "--steps", "-1"}, "--steps '-1' is not an integer >= 0"},
      {{"job.spwt", "--steps", "2.5"}, "--steps '2.5' is not an integer >= 0"},
      {{"job.spwt", "--steps", ""}, "--steps '' is not an integer >= 0"},
      {{"job.spwt", "--steps", "99999999999999999999"},
       "--steps '99999999999999999999' is not an integer >= 0"},
      {{"job.spwt", "--devices", "0"}, "--devices '0' is not an integer from 1 to 8"},
      {{"job.spwt", "--devices", "9"}, "--devices '9' is not an integer from 1 to 8"},
      {{"job.spwt", "--devices", "two"}, "--devices 'two' is not an integer from 1 to 8"},
      {{"job.spwt", "--layers", "0"}, "--layers '0' is not an integer from 1 to 10000"},
      {{"job.spwt", "--offload-layers", "-1"},
       "--offload-layers '-1' is not an integer from 0 to 10000"},
      {{"job.spwt", "--json"}, "--json needs a value"},
      {{"job.spwt", "--trace-out"}, "--trace-out needs a value"},
      {{"job.spwt", "--shim"}, "--shim needs a value"},
      {{"job.spwt", "--bugdet", "60%"}, "unknown option --bugdet"},
      {{"a.spwt", "b.spwt"}, "more than one record given"},
      {{"--no-data"}, "no record given"},
  };
  for (const Case& c : cases) {
    const Args r = parse(c.args);
    std::string shown;
    for (const auto& a : c.args) shown += "'" + a + "' ";
    EXPECT_EQ(r.action, Args::Action::kBad) << shown;
    EXPECT_EQ(r.error, c.error) << shown;
  }
  // The budget's value is checked against the trace's peak once it is read.
  std::string error;
  for (const auto& [budget, why] : std::vector<std::pair<std::string, std::string>>{
           {"0%", "--budget '0%' is not a percentage in (0, 100]"},
           {"101%", "--budget '101%' is not a percentage in (0, 100]"},
           {"-5%", "--budget '-5%' is not a percentage in (0, 100]"},
           {"12parsecs", "--budget '12parsecs' is not a size such as 40GiB or a percentage"},
           {"0.01%", "--budget 0.01% is 0 bytes"}}) {
    EXPECT_FALSE(replay::parse_budget(budget, 1000, &error)) << budget;
    EXPECT_EQ(error, why) << budget;
  }
}

// Issue 13 item 5: --help describes every option a user may give, by name,
// and none of the internal ones.
TEST(ReplayArgs, HelpDescribesEveryOption) {
  const Args r = parse({"--help"});
  ASSERT_EQ(r.action, Args::Action::kHelp);
  for (const char* opt :
       {"--budget", "--device-memory", "--mode", "--strategy", "--steps", "--json", "--trace-out",
        "--no-data", "--layers", "--offload-layers", "--shim", "--version", "RECORD", "SIMULATED"})
    EXPECT_NE(r.help.find(opt), std::string::npos) << opt << " missing in\n" << r.help;
  for (const char* internal : {"--baseline-child", "--quiet", "--inject-corruption"})
    EXPECT_EQ(r.help.find(internal), std::string::npos) << internal << " shown in\n" << r.help;
}

// Found writing fuzz_replay_args's checks (layers >= 0), which then failed
// on it: --layers 4294967295 became -1 layers (the int it was cast to),
// 4294967297 one layer, and 2000000000 made the analysis keep two billion
// event indices a step.
TEST(ReplayArgs, LayersBeyondWhatTheAnalysisCutsAreRefused) {
  for (const char* flag : {"--layers", "--offload-layers"}) {
    for (const char* v : {"4294967295", "4294967297", "2147483648", "10001"}) {
      const Args r = parse({"job.spwt", flag, v});
      EXPECT_EQ(r.action, Args::Action::kBad) << flag << " " << v;
      EXPECT_EQ(r.error, std::string(flag) + " '" + v + "' is not an integer from " +
                             (flag[2] == 'l' ? "1" : "0") + " to 10000");
    }
    EXPECT_EQ(parse({"job.spwt", flag, "10000"}).action, Args::Action::kRun);
  }
  EXPECT_EQ(parse({"job.spwt", "--steps", "99999999999999999999"}).action, Args::Action::kBad);
}

TEST(ReplayArgs, BudgetIsASizeOrAPercentageOfThePeak) {
  std::string error;
  EXPECT_EQ(replay::parse_budget("60%", 1000, &error), 600u);
  EXPECT_EQ(replay::parse_budget("1.5KiB", 0, &error), 1536u);
  EXPECT_FALSE(replay::parse_budget("0%", 1000, &error));
  EXPECT_EQ(error, "--budget '0%' is not a percentage in (0, 100]");
  EXPECT_FALSE(replay::parse_budget("1%", 10, &error));
  EXPECT_EQ(error, "--budget 1% is 0 bytes");
  EXPECT_FALSE(replay::parse_budget("12parsecs", 10, &error));
  EXPECT_EQ(error, "--budget '12parsecs' is not a size such as 40GiB or a percentage");
}

// Found by fuzz_replay_args: the number after a key went through a double
// and a cast, undefined for "-1" or 1e30 (UBSan: float-cast-overflow). Since
// nlohmann-json reads it, a number that is not an unsigned integer, a key
// that is not at the top level, or a text that is not a JSON object gives
// the default.
TEST(ReplayJson, NumbersAreUnsignedIntegersOrTheDefault) {
  const std::string json =
      R"({"a": 42, "b": -1, "c": 1e30, "d": 99999999999999999999, "e":"7", "f":)"
      "\n 18446744073709551615, \"g\": 2.5, \"h\": {\"i\": 3}}";
  EXPECT_EQ(replay::json_u64(json, "a", 7), 42u);
  EXPECT_EQ(replay::json_u64(json, "b", 7), 7u);
  EXPECT_EQ(replay::json_u64(json, "c", 7), 7u);
  EXPECT_EQ(replay::json_u64(json, "d", 7), 7u);
  EXPECT_EQ(replay::json_u64(json, "e", 7), 7u);
  EXPECT_EQ(replay::json_u64(json, "f", 7), UINT64_MAX);
  EXPECT_EQ(replay::json_u64(json, "g", 7), 7u);
  EXPECT_EQ(replay::json_u64(json, "i", 7), 7u);
  EXPECT_EQ(replay::json_u64(json, "missing", 7), 7u);
  EXPECT_EQ(replay::json_u64(R"({"a": 42)", "a", 7), 7u);  // cut short
  EXPECT_EQ(replay::json_u64("[42]", "a", 7), 7u);
}

// Found by fuzz_replay_args (a time-out): an array element that is not a
// number left strtoull where it was, and the loop pushed zeros until memory
// ran out. The child has two seconds (and, unsanitized, 2 GiB of address
// space) to return.
TEST(ReplayJson, ArraysStopAtTheFirstElementThatIsNotANumber) {
  EXPECT_EQ(replay::json_array(R"({"s": [1,2, 3]})", "s"), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EXIT(
      {
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
        struct rlimit lim;
        getrlimit(RLIMIT_AS, &lim);
        lim.rlim_cur = 2ull << 30;  // far above this process, far below the runaway
        setrlimit(RLIMIT_AS, &lim);
#endif
        alarm(2);
        // Not JSON at all: nothing.
        const auto a = replay::json_array(R"({"s": [4, x, 5], "t": [-1], "u": [1)", "s");
        const auto t = replay::json_array(R"({"t": [-1, 2]})", "t");
        const auto u = replay::json_array(R"({"u": [9, 99999999999999999999, 3]})", "u");
        const auto v = replay::json_array(R"({"v": 5})", "v");
        std::exit(a.empty() && t.empty() && u == std::vector<uint64_t>{9} && v.empty() ? 0 : 3);
      },
      ::testing::ExitedWithCode(0), "");
}

void write_trace(const std::string& path, const std::string& meta, uint64_t name_id) {
  namespace tr = spillway::trace;
  tr::Writer w;
  ASSERT_TRUE(w.open(path, meta)) << w.error();
  ASSERT_TRUE(w.string(name_id, "gemm"));
  ASSERT_TRUE(w.alloc(1, 4096, 0, 0));
  ASSERT_TRUE(w.step(0));
  ASSERT_TRUE(w.phase(tr::PhaseKind::kForward));
  const tr::TouchRec t{1, 0, 4096, tr::kModeWrite};
  ASSERT_TRUE(w.launch(0, name_id, 10, std::span(&t, 1)));
  ASSERT_TRUE(w.phase(tr::PhaseKind::kBackward));
  const tr::TouchRec u{1, 0, 4096, tr::kModeRead};
  ASSERT_TRUE(w.launch(0, name_id, 10, std::span(&u, 1)));
  ASSERT_TRUE(w.free(1, 0));
  ASSERT_TRUE(w.close()) << w.error();
}

// Found by fuzz_spwt: a STRING id is any 64-bit number, and the analysis
// kept names in a vector indexed by id (2^56 of them for this one).
TEST_F(TraceFile, StringIdsAreNamesNotIndices) {
  const uint64_t id = uint64_t{1} << 60;
  write_trace(path_, "{}", id);
  replay::Analysis a;
  std::string error;
  ASSERT_TRUE(replay::analyze(path_, 0, a, error)) << error;
  EXPECT_EQ(a.names.at(id), "gemm");
  EXPECT_EQ(a.layers, 8);
}

// Found reading analysis.cpp while writing fuzz_spwt (not by a run): the
// meta's "layers" went through atoi() (2^32 + 1 gave one layer) and any
// count was taken, each step keeping one event index a layer (two billion
// of them, from a few bytes of meta).
TEST_F(TraceFile, MetaLayersBeyondWhatTheAnalysisCutsAreRefused) {
  replay::Analysis a;
  std::string error;
  write_trace(path_, R"({"layers": 12})", 1);
  ASSERT_TRUE(replay::analyze(path_, 0, a, error)) << error;
  EXPECT_EQ(a.layers, 12);
  for (const char* meta : {R"({"layers": 10001})", R"({"num_layers": 4294967297})"}) {
    write_trace(path_, meta, 1);
    replay::Analysis b;
    EXPECT_FALSE(replay::analyze(path_, 0, b, error)) << meta;
    EXPECT_NE(error.find("offset 16: the meta's \"" +
                         std::string(meta[2] == 'l' ? "layers" : "num_layers") + "\" is "),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("more than the 10000 layers"), std::string::npos) << error;
  }
  replay::Analysis c;
  ASSERT_TRUE(replay::analyze(path_, 3, c, error)) << error;  // --layers wins over the meta
  EXPECT_EQ(c.layers, 3);
}

}  // namespace
