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
// LD_LIBRARY_PATH) and returns its exit status and stdout.
ProbeResult RunProbe(std::vector<std::string> args) {
  ProbeResult result;
  int out[2];
  if (pipe(out) != 0) return result;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  args.insert(args.begin(), PROBE_EXECUTABLE);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  char* envp[] = {nullptr};
  pid_t pid;
  const int err = posix_spawn(&pid, PROBE_EXECUTABLE, &actions, nullptr, argv.data(), envp);
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

}  // namespace
}  // namespace simcupti_test
