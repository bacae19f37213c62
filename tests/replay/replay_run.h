// Runs build/bin/spillway-replay in a child process and reads back what it
// wrote: the --json report, stdout and stderr. Shared by the replay tests.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace replay_test {

struct Result {
  int exit_code = -1;
  std::string json, out, err;
  double num(const std::string& key) const {
    const std::string k = "\"" + key + "\": ";
    size_t p = json.find(k);
    EXPECT_NE(p, std::string::npos) << key << " missing in " << json;
    if (p == std::string::npos) return -1;
    return std::strtod(json.c_str() + p + k.size(), nullptr);
  }
  std::string raw(const std::string& key) const {
    const std::string k = "\"" + key + "\": ";
    size_t p = json.find(k);
    if (p == std::string::npos) return "";
    size_t e = json.find_first_of(",\n", p + k.size());
    return json.substr(p + k.size(), e - p - k.size());
  }
  bool flag(const std::string& key) const { return raw(key) == "true"; }
  // A JSON array of numbers (empty when the key is missing or not one).
  std::vector<double> nums(const std::string& key) const {
    std::vector<double> v;
    const std::string k = "\"" + key + "\": [";
    size_t p = json.find(k);
    if (p == std::string::npos) return v;
    const size_t end = json.find(']', p);
    const char* c = json.c_str() + p + k.size();
    while (c < json.c_str() + end) {
      char* next = nullptr;
      const double x = std::strtod(c, &next);
      if (next == c) {
        ++c;
        continue;
      }
      v.push_back(x);
      c = next;
    }
    return v;
  }
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// `dir` holds the child's output files (out.json, stdout, stderr).
inline Result run_replay(const std::string& trace, const std::vector<std::string>& args,
                         const std::filesystem::path& dir) {
  const std::string json = (dir / "out.json").string();
  std::filesystem::remove(json);
  std::vector<std::string> argv{REPLAY_BIN, trace, "--json", json};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  const std::string out = (dir / "stdout").string(), err = (dir / "stderr").string();
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  Result r;
  EXPECT_EQ(0, posix_spawn(&pid, REPLAY_BIN, &fa, nullptr, cargv.data(), environ));
  posix_spawn_file_actions_destroy(&fa);
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.json = slurp(json);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

}  // namespace replay_test
