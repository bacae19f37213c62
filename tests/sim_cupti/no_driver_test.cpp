// CUPTI in a process whose driver is not the simulator. The probe runs in a
// child process with a clean environment, so nothing but what it is told to
// load can be found.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <string>
#include <vector>

#include "sim_gpu.h"

namespace simcupti_test {
namespace {

struct ProbeResult {
  int status = -1;
  std::string output;
};

// Runs the probe with no environment at all (in particular no
// LD_LIBRARY_PATH) but `env`, and returns its exit status and stdout (and
// stderr after it, with `with_stderr`).
ProbeResult RunProbe(std::vector<std::string> args, std::vector<std::string> env = {},
                     bool with_stderr = false) {
  ProbeResult result;
  int out[2];
  if (pipe(out) != 0) return result;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  if (with_stderr) posix_spawn_file_actions_adddup2(&actions, out[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  args.insert(args.begin(), PROBE_EXECUTABLE);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid;
  const int err = posix_spawn(&pid, PROBE_EXECUTABLE, &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (err == 0) {
    std::array<char, 256> chunk;
    ssize_t n;
    while ((n = read(out[0], chunk.data(), chunk.size())) > 0)
      result.output.append(chunk.data(), n);
    int wstatus = 0;
    waitpid(pid, &wstatus, 0);
    result.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
  }
  close(out[0]);
  return result;
}

std::string Expected(CUptiResult r) {
  const std::string code = std::to_string(r);
  return "cuptiSubscribe " + code + "\ncuptiActivityEnable " + code +
         "\ncuptiActivityRegisterCallbacks " + code + "\ncuptiGetTimestamp " + code +
         "\ncuptiGetLastError " + code + "\n";
}

TEST(NoSimulatedDriver, NoDriverAtAllIsNotInitialized) {
  const ProbeResult r = RunProbe({SIMCUPTI_LIBRARY});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, Expected(CUPTI_ERROR_NOT_INITIALIZED));
}

TEST(NoSimulatedDriver, AnotherDriverIsNotInitialized) {
  const ProbeResult r = RunProbe({SIMCUPTI_LIBRARY, OTHER_DRIVER_LIBRARY});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, Expected(CUPTI_ERROR_NOT_INITIALIZED));
}

// The control: the same probe with the simulated driver loaded succeeds, so
// the two tests above fail for the reason they claim.
TEST(NoSimulatedDriver, TheSimulatedDriverInitializes) {
  const ProbeResult r = RunProbe({SIMCUPTI_LIBRARY, SIMCUDA_LIBRARY});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, Expected(CUPTI_SUCCESS));
}

// SIMCUPTI_FAIL (sim/cupti/faults.h): the nth call of the named entry point
// fails, doing nothing, with CUPTI_ERROR_UNKNOWN or the error named, and
// says so on stderr; later calls work; a bad spec ends the process.
TEST(SimcuptiFail, TheNamedCallFailsAndSaysSo) {
  const ProbeResult r = RunProbe({SIMCUPTI_LIBRARY, SIMCUDA_LIBRARY},
                                 {"SIMCUPTI_FAIL=cuptiActivityEnable:1"}, /*with_stderr=*/true);
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string unknown = std::to_string(CUPTI_ERROR_UNKNOWN);
  // stderr is unbuffered and the probe's stdout a pipe: the line comes first.
  const std::string said =
      "simcupti: cuptiActivityEnable call 1: injected failure CUPTI_ERROR_UNKNOWN "
      "(SIMCUPTI_FAIL)\n";
  ASSERT_EQ(r.output.rfind(said, 0), 0u) << r.output;
  EXPECT_EQ(r.output.substr(said.size()),
            "cuptiSubscribe 0\ncuptiActivityEnable " + unknown +
                "\ncuptiActivityRegisterCallbacks 0\ncuptiGetTimestamp 0\ncuptiGetLastError " +
                unknown + "\n");
}

TEST(SimcuptiFail, TheErrorNamedIsReturnedAndACallNotReachedFailsNothing) {
  ProbeResult r = RunProbe({SIMCUPTI_LIBRARY, SIMCUDA_LIBRARY},
                           {"SIMCUPTI_FAIL=cuptiSubscribe:1:CUPTI_ERROR_MAX_LIMIT_REACHED"});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.substr(0, r.output.find('\n')),
            "cuptiSubscribe " + std::to_string(CUPTI_ERROR_MAX_LIMIT_REACHED));
  r = RunProbe({SIMCUPTI_LIBRARY, SIMCUDA_LIBRARY}, {"SIMCUPTI_FAIL=cuptiGetTimestamp:2"},
               /*with_stderr=*/true);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, Expected(CUPTI_SUCCESS));
}

TEST(SimcuptiFail, ABadSpecEndsTheProcessNamingTheItem) {
  for (const char* spec : {"cuptiSubscribe:0", "cuptiSubscribe", "cuSubscribe:1",
                           "cuptiSubscribe:1:CUPTI_ERROR_NOPE", "cuptiSubscribe:x"}) {
    const ProbeResult r = RunProbe({SIMCUPTI_LIBRARY, SIMCUDA_LIBRARY},
                                   {std::string("SIMCUPTI_FAIL=") + spec}, /*with_stderr=*/true);
    EXPECT_EQ(r.status, 2) << spec << ": " << r.output;
    EXPECT_NE(r.output.find("simcupti: SIMCUPTI_FAIL='" + std::string(spec) + "': item"),
              std::string::npos)
        << r.output;
  }
}

}  // namespace
}  // namespace simcupti_test
