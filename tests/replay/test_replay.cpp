// spillway-replay end to end: synthetic transformer-like traces (written here
// with trace::Writer) replayed through the real libspillway.so on the
// simulated GPU, in child processes. Every time figure is simulated.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "replay_run.h"
#include "trace/trace.h"

namespace {

namespace fs = std::filesystem;
using namespace spillway::trace;
using replay_test::Result;
using replay_test::run_replay;
using replay_test::slurp;
constexpr uint64_t MiB = 1ull << 20;

// A transformer-shaped training trace: per layer a weight, its gradient and an
// optimizer state (set-up), and per step a forward pass whose layer inputs and
// hidden activations are saved for the backward pass, which reads them in
// reverse layer order and frees them, then an optimizer phase.
struct Shape {
  int layers = 4;
  int steps = 3;
  uint64_t act = 4 * MiB;
  uint64_t weight = 2 * MiB;
};

void write_transformer(const std::string& path, const Shape& s) {
  Writer w;
  ASSERT_TRUE(w.open(path, R"({"source":"test","model":"synthetic transformer","layers":)" +
                               std::to_string(s.layers) + "}"));
  uint64_t next = 1;
  enum Name : uint64_t { kLinear = 1, kGelu, kProj, kLoss, kLossBwd, kProjBwd, kLinearBwd, kAdam };
  const char* names[] = {"",         "linear",   "gelu",       "proj", "loss",
                         "loss_bwd", "proj_bwd", "linear_bwd", "adam"};
  for (uint64_t i = 1; i <= kAdam; ++i) ASSERT_TRUE(w.string(i, names[i]));
  ASSERT_TRUE(w.string(20, "site:weights"));
  auto alloc = [&](uint64_t size, uint64_t site = 0) {
    const uint64_t id = next++;
    EXPECT_TRUE(w.alloc(id, size, 0, site));
    return id;
  };
  auto launch = [&](uint64_t name, uint64_t ns, std::vector<TouchRec> t) {
    EXPECT_TRUE(w.launch(0, name, ns, t));
  };
  std::vector<uint64_t> W, G, M;
  for (int l = 0; l < s.layers; ++l) {
    W.push_back(alloc(s.weight, 20));
    G.push_back(alloc(s.weight, 20));
    M.push_back(alloc(s.weight, 20));
    EXPECT_TRUE(w.copy(0, CopyKind::kHostToDevice, s.weight, 0, {W.back(), 0}, {0, 0}));
    EXPECT_TRUE(w.copy(0, CopyKind::kMemset, s.weight, 0, {G.back(), 0}, {0, 0}));
    EXPECT_TRUE(w.copy(0, CopyKind::kMemset, s.weight, 0, {M.back(), 0}, {0, 0}));
  }
  const uint64_t t_act = 120000;  // ns: about the time 4 MiB takes over the link (55 GB/s)
  for (int step = 0; step < s.steps; ++step) {
    ASSERT_TRUE(w.step(step));
    ASSERT_TRUE(w.phase(PhaseKind::kForward));
    std::vector<uint64_t> xs{alloc(s.act)}, hs;
    EXPECT_TRUE(w.copy(0, CopyKind::kHostToDevice, s.act, 0, {xs[0], 0}, {0, 0}));
    for (int l = 0; l < s.layers; ++l) {
      const uint64_t h = alloc(s.act);
      launch(kLinear, t_act,
             {{W[l], 0, s.weight, kModeRead},
              {xs[l], 0, s.act, kModeRead},
              {h, 0, s.act, kModeWrite}});
      const uint64_t tmp = alloc(s.act / 2);
      launch(kGelu, t_act / 2, {{h, 0, s.act / 2, kModeRead}, {tmp, 0, s.act / 2, kModeWrite}});
      const uint64_t y = alloc(s.act);
      launch(kProj, t_act,
             {{tmp, 0, s.act / 2, kModeRead},
              {W[l], 0, s.weight, kModeRead},
              {y, 0, s.act / 2, kModeWrite},
              {y, s.act / 2, s.act / 2, kModeReadWrite}});
      EXPECT_TRUE(w.free(tmp, 0));
      hs.push_back(h);
      xs.push_back(y);
    }
    const uint64_t loss = alloc(4096);
    launch(kLoss, 20000, {{xs.back(), 0, s.act, kModeRead}, {loss, 0, 4096, kModeWrite}});
    EXPECT_TRUE(w.copy(0, CopyKind::kDeviceToHost, 8, 0, {0, 0}, {loss, 0}));  // loss.item()
    ASSERT_TRUE(w.phase(PhaseKind::kBackward));
    uint64_t g = alloc(s.act);
    launch(
        kLossBwd, 20000,
        {{loss, 0, 4096, kModeRead}, {xs.back(), 0, s.act, kModeRead}, {g, 0, s.act, kModeWrite}});
    EXPECT_TRUE(w.free(loss, 0));
    for (int l = s.layers - 1; l >= 0; --l) {
      launch(kProjBwd, t_act,
             {{g, 0, s.act, kModeRead},
              {hs[l], 0, s.act, kModeRead},
              {G[l], 0, s.weight, kModeReadWrite}});
      const uint64_t gx = alloc(s.act);
      launch(kLinearBwd, t_act,
             {{g, 0, s.act, kModeRead},
              {xs[l], 0, s.act, kModeRead},
              {W[l], 0, s.weight, kModeRead},
              {gx, 0, s.act, kModeWrite}});
      EXPECT_TRUE(w.free(g, 0));
      EXPECT_TRUE(w.free(hs[l], 0));
      EXPECT_TRUE(w.free(xs[l + 1], 0));
      g = gx;
    }
    EXPECT_TRUE(w.free(g, 0));
    EXPECT_TRUE(w.free(xs[0], 0));
    ASSERT_TRUE(w.phase(PhaseKind::kOptimizer));
    for (int l = 0; l < s.layers; ++l) {
      launch(kAdam, 10000,
             {{W[l], 0, s.weight, kModeReadWrite},
              {G[l], 0, s.weight, kModeRead},
              {M[l], 0, s.weight, kModeReadWrite}});
    }
  }
  ASSERT_TRUE(w.close()) << w.error();
}

// Both links at `gbps` GB/s for the replays of one test (the replayer and
// the simulator read SIMCUDA_*_GBPS), so that copies outlast compute.
struct SlowLink {
  explicit SlowLink(const char* gbps) {
    setenv("SIMCUDA_D2H_GBPS", gbps, 1);
    setenv("SIMCUDA_H2D_GBPS", gbps, 1);
  }
  ~SlowLink() {
    unsetenv("SIMCUDA_D2H_GBPS");
    unsetenv("SIMCUDA_H2D_GBPS");
  }
};

class ReplayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("spillway_replay_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    trace_ = (dir_ / "t.spwt").string();
    write_transformer(trace_, Shape{});
  }
  void TearDown() override { fs::remove_all(dir_); }

  Result replay(std::vector<std::string> args, const std::string& trace = "") {
    return run_replay(trace.empty() ? trace_ : trace, args, dir_);
  }

  fs::path dir_;
  std::string trace_;
};

#define EXPECT_COMPLETE(r)                                                        \
  do {                                                                            \
    EXPECT_EQ((r).exit_code, 0) << (r).err << (r).out;                            \
    EXPECT_FALSE((r).flag("oom")) << (r).json;                                    \
    EXPECT_TRUE((r).flag("integrity_ok")) << (r).json;                            \
    EXPECT_EQ((r).num("steps_completed"), 3) << (r).json;                         \
    EXPECT_LE((r).num("peak_device_bytes"), (r).num("budget_bytes")) << (r).json; \
  } while (0)

TEST_F(ReplayTest, FullBudgetCompletesWithoutEvictionsAndReportsSimulatedTimes) {
  Result r = replay({"--budget", "100%", "--trace-out", (dir_ / "chrome.json").string()});
  EXPECT_COMPLETE(r);
  EXPECT_GT(r.num("unconstrained_peak_bytes"), 40 * MiB);
  EXPECT_EQ(r.num("budget_bytes"), r.num("unconstrained_peak_bytes"));
  // "record" names the .spwt file; the keys' old names are kept for scripts.
  EXPECT_EQ(r.num("steps_in_record"), 3) << r.json;
  EXPECT_EQ(r.num("steps_in_trace"), 3) << r.json;
  EXPECT_GT(r.num("record_peak_live_bytes"), 0) << r.json;
  EXPECT_EQ(r.num("trace_peak_live_bytes"), r.num("record_peak_live_bytes")) << r.json;
  EXPECT_NE(r.json.find("\"record\": \""), std::string::npos) << r.json;
  EXPECT_GT(r.num("bytes_checked"), 0);
  EXPECT_GT(r.num("sim_step_time_ns"), 0);
  EXPECT_GT(r.num("sim_baseline_step_time_ns"), 0);
  EXPECT_GT(r.num("sim_lower_bound_step_time_ns"), 0);
  EXPECT_LE(r.num("sim_lower_bound_step_time_ns"), r.num("sim_step_time_ns"));
  EXPECT_NE(r.json.find("simulated"), std::string::npos);
  EXPECT_NE(r.out.find("simulated"), std::string::npos);
  EXPECT_NE(r.err.find("step 2 done (3/3)"), std::string::npos) << r.err;
  const std::string chrome = slurp(dir_ / "chrome.json");
  // The shim's format (base/chrome_events.h): an array, one event a line,
  // closed, on the simulated clock.
  EXPECT_EQ(0u, chrome.find("[{\"name\":\"spillway-replay trace start\""));
  EXPECT_EQ(chrome.size() - 2, chrome.rfind("]\n"));
  EXPECT_NE(chrome.find("\"clock\":\"simulated (sim virtual host time)\""), std::string::npos);
  EXPECT_NE(chrome.find("\n,{\"name\":\"process_name\""), std::string::npos);
  EXPECT_NE(chrome.find("\"name\":\"step 2\""), std::string::npos);
  EXPECT_NE(chrome.find("device_bytes"), std::string::npos);
}

// Each step's lower bound is reported beside their median, and it can only
// rise as the budget falls: the same step with more bytes forced off the GPU
// (each is at least the baseline's same step, which both runs share). A slow
// link (2 GB/s each way, in the runs and in the bound's formula) makes the
// forced bytes cost more than this small trace's compute.
TEST_F(ReplayTest, EachStepHasItsLowerBoundAndItRisesAsTheBudgetFalls) {
  SlowLink slow("2");
  Result full = replay({"--budget", "100%", "--no-data"});
  Result tight = replay({"--budget", "40%", "--no-data"});
  ASSERT_EQ(full.exit_code, 0) << full.err;
  ASSERT_EQ(tight.exit_code, 0) << tight.err;
  const std::vector<double> f = full.nums("sim_lower_bound_step_times_ns");
  const std::vector<double> t = tight.nums("sim_lower_bound_step_times_ns");
  ASSERT_EQ(f.size(), 3u) << full.json;
  ASSERT_EQ(t.size(), 3u) << tight.json;
  for (const Result* r : {&full, &tight}) {
    std::vector<double> v = r->nums("sim_lower_bound_step_times_ns");
    std::sort(v.begin(), v.end());
    EXPECT_EQ(v[1], r->num("sim_lower_bound_step_time_ns")) << r->json;
  }
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_GT(f[s], 0) << s;
    EXPECT_GE(t[s], f[s]) << s;
  }
  // 40% forces bytes off in every step of this trace: the last step's bound
  // is above the one with nothing forced, and stdout names it.
  EXPECT_GT(t[2], f[2]);
  char last[64];
  std::snprintf(last, sizeof last, "the last step's lower bound %.3f ms", t[2] / 1e6);
  EXPECT_NE(tight.out.find(last), std::string::npos) << tight.out;
}

// The cyclic bound counts the bytes a later read needs, not all live bytes:
// per step a weight W (1 MiB, read in every step, live at the end) and four
// 4 MiB blocks made at once, three read back and one (D) never read. At the
// peak 17 MiB are live but 13 MiB needed; with an 8 MiB budget 5 MiB must
// cross each link once a step, which at 1 GB/s outlasts the step's compute.
TEST_F(ReplayTest, TheCyclicBoundCountsOnlyBytesReadAgain) {
  SlowLink slow("1");
  const std::string path = (dir_ / "dead.spwt").string();
  {
    Writer w;
    ASSERT_TRUE(w.open(path, R"({"source":"test"})"));
    ASSERT_TRUE(w.string(1, "k"));
    uint64_t next = 1;
    const uint64_t W = next++;
    ASSERT_TRUE(w.alloc(W, 1 * MiB, 0, 0));
    auto launch = [&](std::vector<TouchRec> t) { return w.launch(0, 1, 10000, t); };
    ASSERT_TRUE(launch({{W, 0, 1 * MiB, kModeWrite}}));
    for (int step = 0; step < 2; ++step) {
      ASSERT_TRUE(w.step(step));
      std::vector<uint64_t> blocks;
      for (int i = 0; i < 4; ++i) {
        blocks.push_back(next++);
        ASSERT_TRUE(w.alloc(blocks.back(), 4 * MiB, 0, 0));
        ASSERT_TRUE(launch({{W, 0, 1 * MiB, kModeRead}, {blocks.back(), 0, 4 * MiB, kModeWrite}}));
      }
      for (int i = 0; i < 3; ++i)  // D, the last, is never read
        ASSERT_TRUE(launch({{blocks[i], 0, 4 * MiB, kModeRead}}));
      for (uint64_t b : blocks) ASSERT_TRUE(w.free(b, 0));
    }
    ASSERT_TRUE(w.close()) << w.error();
  }
  Result r = replay({"--budget", std::to_string(8 * MiB), "--no-data"}, path);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const std::vector<double> cyclic = r.nums("sim_cyclic_bound_step_times_ns");
  const std::vector<double> classic = r.nums("sim_lower_bound_step_times_ns");
  ASSERT_EQ(cyclic.size(), 2u) << r.json;
  ASSERT_EQ(classic.size(), 2u) << r.json;
  for (size_t s = 0; s < 2; ++s) {
    EXPECT_EQ(cyclic[s], 5.0 * MiB) << s;   // 5 MiB at 1 byte a nanosecond
    EXPECT_GT(classic[s], cyclic[s]) << s;  // 9 MiB live over the budget, out then in
  }
}

// The ideal without foresight plans the last step with every block live at
// its start on the device there. Here S (4 MiB, live throughout, read once
// a step) cannot share the 12 MiB budget with A (10 MiB, made after the
// step's first launch, used for 10 ms): the cyclic ideal evicts S in the
// step before, after its read, and starts the step with it off; without
// foresight S must leave before A is made, after that first launch, with
// the link at 1 byte a nanosecond: about 4 ms more. Simulated time.
TEST_F(ReplayTest, TheIdealWithoutForesightStartsWithTheCarriedBlocksOnTheDevice) {
  SlowLink slow("1");
  const std::string path = (dir_ / "carried.spwt").string();
  {
    Writer w;
    ASSERT_TRUE(w.open(path, R"({"source":"test"})"));
    ASSERT_TRUE(w.string(1, "k"));
    uint64_t next = 1;
    const uint64_t S = next++, t = next++;
    ASSERT_TRUE(w.alloc(S, 4 * MiB, 0, 0));
    ASSERT_TRUE(w.alloc(t, 4096, 0, 0));
    auto launch = [&](uint64_t ns, std::vector<TouchRec> touches) {
      return w.launch(0, 1, ns, touches);
    };
    ASSERT_TRUE(launch(10000, {{S, 0, 4 * MiB, kModeWrite}}));
    for (int step = 0; step < 2; ++step) {
      ASSERT_TRUE(w.step(step));
      ASSERT_TRUE(launch(10000, {{t, 0, 4096, kModeReadWrite}}));
      const uint64_t A = next++;
      ASSERT_TRUE(w.alloc(A, 10 * MiB, 0, 0));
      ASSERT_TRUE(launch(1'000'000, {{A, 0, 10 * MiB, kModeWrite}}));
      for (int i = 0; i < 9; ++i) ASSERT_TRUE(launch(1'000'000, {{A, 0, 10 * MiB, kModeRead}}));
      ASSERT_TRUE(w.free(A, 0));
      ASSERT_TRUE(launch(10000, {{S, 0, 4 * MiB, kModeReadWrite}}));
      for (int i = 0; i < 10; ++i) ASSERT_TRUE(launch(1'000'000, {{t, 0, 4096, kModeReadWrite}}));
    }
    ASSERT_TRUE(w.close()) << w.error();
  }
  Result r = replay({"--budget", std::to_string(12 * MiB), "--no-data"}, path);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const double cyclic = r.num("ideal_step_time_ns");
  const double fresh = r.num("ideal_without_foresight_last_step_ns");
  EXPECT_GE(fresh, cyclic + 3e6) << r.json;
  EXPECT_EQ(r.num("ideal_without_foresight_last_step_bytes_moved"), 8.0 * MiB) << r.json;
  EXPECT_TRUE(r.flag("ideal_without_foresight_fits")) << r.json;
  EXPECT_NE(r.out.find("ideal without foresight"), std::string::npos) << r.out;
}

// At a budget equal to the unconstrained peak nothing needs to move: the
// shim's background evictor stays idle until an allocation has had to evict
// (the job has shown it does not fit), and releases cached blocks before
// evicting live ones.
TEST_F(ReplayTest, FullBudgetMovesNoBytesAtAll) {
  Result r = replay({"--budget", "100%"});
  EXPECT_COMPLETE(r);
  const std::string shim = r.json.substr(r.json.find("\"shim\""));
  EXPECT_NE(shim.find("\"blocks_evicted\": 0,"), std::string::npos) << shim;
  EXPECT_NE(shim.find("\"blocks_restored\": 0,"), std::string::npos) << shim;
  EXPECT_EQ(r.num("bytes_device_to_host"), 0) << r.json;
  EXPECT_EQ(r.num("bytes_host_to_device"), 0) << r.json;
}

TEST_F(ReplayTest, SpillwayCompletesAtFortyPercentWhereNoneRunsOutOfMemory) {
  Result probe = replay({"--strategy", "none", "--no-data"});
  ASSERT_EQ(probe.exit_code, 0) << probe.err;
  const uint64_t peak = static_cast<uint64_t>(probe.num("unconstrained_peak_bytes"));
  const std::string device = std::to_string(peak * 6 / 10);
  Result none = replay({"--strategy", "none", "--device-memory", device});
  EXPECT_EQ(none.exit_code, 0) << none.err;  // an OOM is a result
  EXPECT_TRUE(none.flag("oom")) << none.json;
  EXPECT_NE(none.json.find("\"oom_at\""), std::string::npos);
  EXPECT_LT(none.num("steps_completed"), 3);

  Result r = replay({"--budget", "40%", "--device-memory", device});
  EXPECT_COMPLETE(r);
  EXPECT_LE(r.num("peak_device_bytes"), 0.4 * static_cast<double>(peak) + 1);
  EXPECT_GT(r.num("bytes_device_to_host"), 0);
  EXPECT_GT(r.num("bytes_host_to_device"), 0);
  EXPECT_GE(r.num("sim_step_time_ns"), r.num("sim_lower_bound_step_time_ns"));
  EXPECT_GT(r.num("sim_lower_bound_step_time_ns"), 0);
}

// SPILLWAY_MODE=managed on the same trace: the same guarantees as host mode
// (every byte checked, no OOM, peak within the budget), by prefetches.
TEST_F(ReplayTest, ManagedModeCompletesAtFortyPercent) {
  Result probe = replay({"--strategy", "none", "--no-data"});
  ASSERT_EQ(probe.exit_code, 0) << probe.err;
  const uint64_t peak = static_cast<uint64_t>(probe.num("unconstrained_peak_bytes"));
  const std::string device = std::to_string(peak * 6 / 10);
  Result r = replay({"--mode", "managed", "--budget", "40%", "--device-memory", device});
  EXPECT_COMPLETE(r);
  EXPECT_NE(r.json.find("\"mode\": \"managed\""), std::string::npos) << r.json;
  EXPECT_LE(r.num("peak_device_bytes"), 0.4 * static_cast<double>(peak) + 1) << r.err;
  EXPECT_GT(r.num("bytes_device_to_host"), 0);
  EXPECT_GT(r.num("bytes_host_to_device"), 0);
  EXPECT_EQ(r.err.find("only caches"), std::string::npos) << "no fallback: " << r.err;
}

TEST_F(ReplayTest, AnchorStrategiesCompleteWithTheirCopies) {
  for (const char* s : {"save_on_cpu", "torchtune", "layerwise"}) {
    SCOPED_TRACE(s);
    Result r = replay({"--strategy", s, "--budget", "100%"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_FALSE(r.flag("oom"));
    EXPECT_TRUE(r.flag("integrity_ok")) << r.json;
    EXPECT_EQ(r.num("steps_completed"), 3);
    EXPECT_GT(r.num("bytes_device_to_host"), 0);
    EXPECT_EQ(r.num("bytes_device_to_host"), r.num("bytes_host_to_device"));
    EXPECT_LT(r.num("peak_device_bytes"), r.num("unconstrained_peak_bytes")) << r.json;
    EXPECT_GT(r.num("sim_step_time_ns"), r.num("sim_baseline_step_time_ns"));
  }
}

// --devices: the record on two simulated devices at once, one thread each
// (a one-process data-parallel job). Each device keeps its own budget and
// every byte of its own data, which differs from the other's (a block
// restored on the wrong device would read wrong).
TEST_F(ReplayTest, TwoDevicesEachKeepTheirBytesWithinTheirBudget) {
  Result r = replay({"--budget", "40%", "--devices", "2"});
  EXPECT_COMPLETE(r);
  EXPECT_EQ(r.num("devices"), 2) << r.json;
  const std::string per = r.json.substr(r.json.find("\"per_device\""));
  const double budget = r.num("budget_bytes");
  for (int d = 0; d < 2; ++d) {
    SCOPED_TRACE(d);
    const size_t at = per.find("\"device\": " + std::to_string(d) + ",");
    ASSERT_NE(at, std::string::npos) << per;
    Result dev;
    dev.json = per.substr(at, per.find('}', at) - at);
    EXPECT_EQ(dev.num("steps_completed"), 3);
    EXPECT_TRUE(dev.flag("integrity_ok"));
    EXPECT_GT(dev.num("bytes_checked"), 0);
    // The unconstrained peak is 2.5 times the budget: each device stayed
    // under its budget only because spillway moved its blocks.
    EXPECT_LE(dev.num("peak_device_bytes"), budget);
    EXPECT_GT(dev.num("peak_device_bytes"), 0.5 * budget);
  }
  EXPECT_GT(r.num("unconstrained_peak_bytes"), 2 * budget);
  // Both devices evicted and restored (the shim's counters sum them): more
  // than one device's worth.
  Result one = replay({"--budget", "40%"});
  EXPECT_COMPLETE(one);
  EXPECT_GT(r.num("blocks_evicted"), one.num("blocks_evicted")) << r.json;
}

// A byte corrupted on each device is caught on each, and the report names
// the device of every mismatch but device 0's.
TEST_F(ReplayTest, ACorruptedByteIsCaughtOnEveryDevice) {
  Result r = replay({"--budget", "40%", "--devices", "2", "--inject-corruption", "0"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_FALSE(r.flag("integrity_ok")) << r.json;
  EXPECT_NE(r.json.find("\"first_mismatch\": \"allocation 14 byte 0"), std::string::npos) << r.json;
  const std::string per = r.json.substr(r.json.find("\"per_device\""));
  EXPECT_EQ(per.find("\"integrity_ok\": true"), std::string::npos) << per;
  EXPECT_NE(per.find("\"integrity_ok\": false"), per.rfind("\"integrity_ok\": false")) << per;
}

TEST_F(ReplayTest, CorruptedByteIsCaught) {
  for (const char* budget : {"100%", "40%"}) {
    SCOPED_TRACE(budget);
    Result r = replay({"--budget", budget, "--inject-corruption", "0"});
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_FALSE(r.flag("integrity_ok")) << r.json;
    EXPECT_NE(r.json.find("\"first_mismatch\": \"allocation 14 byte 0"), std::string::npos)
        << r.json;
    EXPECT_NE(r.out.find("integrity FAILED"), std::string::npos) << r.out;
  }
}

TEST_F(ReplayTest, AccountingModeChecksNoBytes) {
  Result r = replay({"--budget", "40%", "--no-data"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.raw("integrity_ok"), "null");
  EXPECT_EQ(r.raw("data_checked"), "false");
  EXPECT_EQ(r.num("bytes_checked"), 0);
  EXPECT_EQ(r.num("steps_completed"), 3);
  EXPECT_LE(r.num("peak_device_bytes"), r.num("budget_bytes"));
  EXPECT_GT(r.num("bytes_device_to_host"), 0);
}

TEST_F(ReplayTest, CorruptTraceIsRefusedWithItsOffset) {
  std::string bytes = slurp(trace_);
  const size_t at = bytes.find("BLK1") + 16 + 3;  // a payload byte of the first block
  bytes[at] = static_cast<char>(bytes[at] ^ 0x10);
  const std::string bad = (dir_ / "bad.spwt").string();
  std::ofstream(bad, std::ios::binary) << bytes;
  Result r = replay({}, bad);
  EXPECT_EQ(r.exit_code, 2);
  const std::string want = "offset " + std::to_string(bytes.find("BLK1")) + ": block CRC mismatch";
  EXPECT_NE(r.err.find(want), std::string::npos) << r.err;

  std::ofstream(bad, std::ios::binary | std::ios::trunc) << slurp(trace_).substr(0, 1000);
  r = replay({}, bad);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("offset 1000: file is truncated"), std::string::npos) << r.err;
}

TEST_F(ReplayTest, BadArgumentsExitTwo) {
  for (std::vector<std::string> args : {std::vector<std::string>{"--budget", "0%"},
                                        {"--budget", "12parsecs"},
                                        {"--strategy", "magic"},
                                        {"--mode", "unified"},
                                        {"--steps", "-1"},
                                        {"--frobnicate"},
                                        {"--device-memory", "1.5"}}) {
    Result r = replay(args);
    EXPECT_EQ(r.exit_code, 2) << args[0] << " " << (args.size() > 1 ? args[1] : "") << r.err;
    EXPECT_NE(r.err.find("usage"), std::string::npos);
  }
}

// Issue 15 item 3: an output path that cannot be written stops the command
// before the replay, named (it used to be lost silently after the replay,
// with exit status 0).
TEST_F(ReplayTest, AnUnwritableOutputIsRefusedByNameBeforeTheReplay) {
  const std::string missing = (dir_ / "no-such-dir").string();
  Result r = replay({"--json", missing + "/out.json"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("spillway-replay: cannot write --json '" + missing +
                       "/out.json': its directory '" + missing + "' does not exist"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("baseline run"), std::string::npos) << r.err;  // nothing ran
  r = replay({"--trace-out", dir_.string()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("cannot write --trace-out '" + dir_.string() + "': it is a directory"),
            std::string::npos)
      << r.err;
}

// Step plans (SPILLWAY_PLAN, on by default) through the preloaded path:
// launch durations from the activity records (a reader started once the
// budget was crossed), a plan made once two steps were alike (steps 0 and 1
// of five), carried out in the steps after, every byte kept.
TEST_F(ReplayTest, StepPlansAreMadeAndCarriedOutWithEveryByteKept) {
  Shape five;
  five.steps = 5;
  const std::string trace = (dir_ / "five.spwt").string();
  write_transformer(trace, five);
  Result r = replay({"--budget", "40%"}, trace);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.num("steps_completed"), 5);
  EXPECT_TRUE(r.flag("integrity_ok")) << r.json;
  EXPECT_FALSE(r.flag("oom"));
  EXPECT_GE(r.num("plans_made"), 1) << r.json;
  EXPECT_GT(r.num("planned_evictions"), 0) << r.json;
  EXPECT_GT(r.num("planned_prefetches"), 0) << r.json;
  EXPECT_LE(r.num("peak_device_bytes"), r.num("budget_bytes"));

  ASSERT_EQ(0, setenv("SPILLWAY_PLAN", "off", 1));
  Result off = replay({"--budget", "40%"}, trace);
  ASSERT_EQ(0, unsetenv("SPILLWAY_PLAN"));
  EXPECT_TRUE(off.flag("integrity_ok")) << off.json;
  EXPECT_EQ(off.num("plans_made"), 0) << off.json;

  Result fits = replay({"--budget", "100%"}, trace);  // nothing to plan
  EXPECT_TRUE(fits.flag("integrity_ok")) << fits.json;
  EXPECT_EQ(fits.num("plans_made"), 0) << fits.json;
  EXPECT_EQ(fits.num("bytes_device_to_host"), 0) << fits.json;
}

// A step's end waits for the record's streams, as loss.item() does, not for
// work the shim queued on a stream of its own (spillway's copies), unless
// --step-sync context asks for every stream. The stand-in shim queues a
// 50 ms copy (at 1 GB/s) on its own stream at each step mark; each of the
// record's three steps is one 1 ms kernel, and no copy of its own
// (simulated time). The replayer marks where a job does, after each step
// and not before the first, so step 0 has no copy to wait for.
TEST_F(ReplayTest, AStepsEndWaitsForTheRecordsStreamsOrTheWholeContextWhenAsked) {
  const std::string path = (dir_ / "kernels.spwt").string();
  {
    Writer w;
    ASSERT_TRUE(w.open(path, R"({"source":"test","model":"one kernel a step"})"));
    ASSERT_TRUE(w.string(1, "k"));
    for (uint64_t step = 0; step < 3; ++step) {
      ASSERT_TRUE(w.step(step));
      ASSERT_TRUE(w.alloc(step + 1, 4 * MiB, 0, 0));
      const std::vector<TouchRec> t{{step + 1, 0, 4 * MiB, kModeWrite}};
      ASSERT_TRUE(w.launch(0, 1, 1'000'000, t));
      ASSERT_TRUE(w.free(step + 1, 0));
    }
    ASSERT_TRUE(w.close()) << w.error();
  }
  SlowLink slow("1");
  Result streams = replay({"--shim", SIDE_STREAM_SHIM}, path);
  ASSERT_EQ(streams.exit_code, 0) << streams.err;
  Result context = replay({"--shim", SIDE_STREAM_SHIM, "--step-sync", "context"}, path);
  ASSERT_EQ(context.exit_code, 0) << context.err;
  const std::vector<double> s = streams.nums("step_times_ns"), c = context.nums("step_times_ns");
  ASSERT_EQ(s.size(), 3u) << streams.json;
  ASSERT_EQ(c.size(), 3u) << context.json;
  EXPECT_LT(s[0], 10e6) << "a copy was queued before step 0: a mark before the first step";
  EXPECT_LT(c[0], 10e6) << "a copy was queued before step 0: a mark before the first step";
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_LT(s[i], 10e6) << "step " << i << " waited for the shim's stream";
    EXPECT_GE(c[i], 50e6) << "step " << i << " did not wait for the shim's stream";
  }
  // One mark after each step, the last too, as a job's last step() makes.
  EXPECT_EQ(streams.num("steps_marked"), 3) << streams.json;
  EXPECT_TRUE(streams.flag("integrity_ok"));
  EXPECT_TRUE(context.flag("integrity_ok"));
}

TEST_F(ReplayTest, StepsLimitsTheReplay) {
  Result r = replay({"--steps", "1", "--budget", "60%"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.num("steps_completed"), 1);
  EXPECT_TRUE(r.flag("integrity_ok"));
}

}  // namespace
