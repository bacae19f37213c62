// The committed real-model traces (harness/records/) replayed at 100%,
// 60% and 40% of their unconstrained peak: each completes every step without
// an OOM, stays within its budget, and keeps every byte; at 100% nothing
// moves. llama7b (70 GB peak) runs in accounting mode (--no-data), where the
// simulator moves no byte and integrity is not checked. Simulated time only.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <tuple>

#include "replay_run.h"

namespace {

namespace fs = std::filesystem;
using replay_test::Result;

class CommittedTrace : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("spillway_traces_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_P(CommittedTrace, CompletesWithinTheBudgetAndKeepsEveryByte) {
  const std::string& model = std::get<0>(GetParam());
  const int pct = std::get<1>(GetParam());
  const bool no_data = model == "llama7b";
  std::vector<std::string> args{"--budget", std::to_string(pct) + "%"};
  if (no_data) args.push_back("--no-data");
  const Result r =
      replay_test::run_replay(std::string(TRACES_DIR) + "/" + model + ".spwt", args, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_FALSE(r.flag("oom")) << r.json;
  EXPECT_GT(r.num("steps_in_record"), 0);
  EXPECT_EQ(r.num("steps_completed"), r.num("steps_in_record")) << r.json;
  EXPECT_LE(r.num("peak_device_bytes"), r.num("budget_bytes")) << r.json;
  EXPECT_TRUE(r.flag("within_budget")) << r.json;
  if (no_data) {
    EXPECT_EQ(r.raw("integrity_ok"), "null");
  } else {
    EXPECT_TRUE(r.flag("integrity_ok")) << r.json;
    EXPECT_GT(r.num("bytes_checked"), 0);
  }
  // The lower bound is never below the baseline (moving memory cannot make
  // a step faster), and the ideal (the planner given the exact future) fits
  // the budget, costs nothing at 100% and something below it.
  EXPECT_GE(r.num("sim_lower_bound_step_time_ns"), r.num("sim_baseline_step_time_ns")) << r.json;
  EXPECT_EQ(r.nums("sim_lower_bound_step_times_ns").size(),
            static_cast<size_t>(r.num("steps_in_record")))
      << r.json;
  EXPECT_TRUE(r.flag("ideal_fits")) << r.json;
  EXPECT_NE(r.raw("ideal_step_times_ns").find('['), std::string::npos) << r.json;
  // With memory in handles of exact sizes the same plan costs its VMM calls
  // too (every driver call costs 500 ns by default): never less.
  EXPECT_GE(r.num("ideal_handles_step_time_ns"), r.num("ideal_step_time_ns")) << r.json;
  // The last step planned without foresight (nothing carried from the step
  // before) is reported beside the ideal.
  EXPECT_GT(r.num("ideal_without_foresight_last_step_ns"), 0) << r.json;
  if (pct == 100) {
    EXPECT_EQ(r.num("bytes_device_to_host"), 0) << r.json;
    EXPECT_EQ(r.num("bytes_host_to_device"), 0) << r.json;
    EXPECT_EQ(r.num("min_bytes_moved"), 0) << r.json;
    // Everything fits from the step's start: nothing to move without
    // foresight either.
    EXPECT_EQ(r.num("ideal_without_foresight_last_step_bytes_moved"), 0) << r.json;
    EXPECT_TRUE(r.flag("ideal_without_foresight_fits")) << r.json;
  } else {
    EXPECT_GT(r.num("bytes_device_to_host"), 0) << r.json;
    EXPECT_GT(r.num("min_bytes_moved"), 0) << r.json;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CommittedTrace,
                         ::testing::Combine(::testing::Values(std::string("gpt_varlen"),
                                                              std::string("gpt_varlen_first_long"),
                                                              std::string("resnet50"),
                                                              std::string("vit_b16"),
                                                              std::string("llama7b")),
                                            ::testing::Values(100, 60, 40)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_at_" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
