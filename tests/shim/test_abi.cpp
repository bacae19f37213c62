// libspillway.so's C ABI (shim/include/spillway.h) as a process sees it. Each
// test starts child processes with an environment built here (nothing
// inherited but sanitizer options): /bin/true with the library preloaded, or
// abi_probe (abi_probe.c), which dlopens the library and calls the ABI as its
// command line says. stdout and stderr are captured into files.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SHIM_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SHIM_SANITIZED 1
#endif
#endif

namespace {

namespace fs = std::filesystem;
constexpr size_t MiB = 1ull << 20;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string line; std::getline(ss, line);) out.push_back(line);
  return out;
}

size_t count_lines_with(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (const std::string& l : split_lines(text)) n += l.find(needle) != std::string::npos;
  return n;
}

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// ---- A strict JSON (RFC 8259) checker that also collects the top-level
// object's members as their raw text.
class JsonChecker {
 public:
  explicit JsonChecker(const std::string& s) : s_(s) {}
  bool ok(std::map<std::string, std::string>* members, std::string* why) {
    members_ = members;
    ws();
    bool good = value(0) && (ws(), pos_ == s_.size());
    if (!good) *why = "invalid JSON at offset " + std::to_string(pos_) + " of: " + s_;
    return good;
  }

 private:
  const std::string& s_;
  size_t pos_ = 0;
  std::map<std::string, std::string>* members_ = nullptr;

  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  bool eat(char c) { return peek() == c ? (++pos_, true) : false; }
  void ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  bool digits() {
    size_t start = pos_;
    while (std::isdigit(static_cast<unsigned char>(peek()))) ++pos_;
    return pos_ > start;
  }
  bool value(int depth) {
    if (depth > 64) return false;
    switch (peek()) {
      case '{':
        return object(depth);
      case '[':
        return array(depth);
      case '"':
        return string(nullptr);
      case 't':
        return literal("true");
      case 'f':
        return literal("false");
      case 'n':
        return literal("null");
      default:
        return number();
    }
  }
  bool literal(const char* word) {
    if (s_.compare(pos_, std::strlen(word), word) != 0) return false;
    pos_ += std::strlen(word);
    return true;
  }
  bool number() {
    eat('-');
    if (!eat('0') &&
        !(std::isdigit(static_cast<unsigned char>(peek())) && peek() != '0' && digits()))
      return false;
    if (eat('.') && !digits()) return false;
    if (eat('e') || eat('E')) {
      if (!eat('+')) eat('-');
      if (!digits()) return false;
    }
    return true;
  }
  bool string(std::string* out) {
    if (!eat('"')) return false;
    while (pos_ < s_.size()) {
      char c = s_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c == '\\') {
        char e = peek();
        ++pos_;
        if (e == 'u') {
          for (int i = 0; i < 4; ++i, ++pos_)
            if (!std::isxdigit(static_cast<unsigned char>(peek()))) return false;
        } else if (!std::strchr("\"\\/bfnrt", e) || e == '\0') {
          return false;
        }
      }
      if (out) out->push_back(c);
    }
    return false;
  }
  bool object(int depth) {
    eat('{');
    ws();
    if (eat('}')) return true;
    do {
      ws();
      std::string key;
      if (!string(&key)) return false;
      ws();
      if (!eat(':')) return false;
      ws();
      size_t start = pos_;
      if (!value(depth + 1)) return false;
      if (depth == 0 && members_) {
        if (members_->count(key)) return false;  // a duplicate key is no use to anyone
        (*members_)[key] = s_.substr(start, pos_ - start);
      }
      ws();
    } while (eat(','));
    return eat('}');
  }
  bool array(int depth) {
    eat('[');
    ws();
    if (eat(']')) return true;
    do {
      ws();
      if (!value(depth + 1)) return false;
      ws();
    } while (eat(','));
    return eat(']');
  }
};

// The top-level members of a stats JSON object; fails the test if invalid.
std::map<std::string, std::string> stats_members(const std::string& json) {
  std::map<std::string, std::string> m;
  std::string why;
  EXPECT_TRUE(JsonChecker(json).ok(&m, &why)) << why;
  return m;
}

// A counter of a stats object, as a number (-1 if missing or not an integer).
long long counter(const std::map<std::string, std::string>& m, const std::string& key) {
  auto it = m.find(key);
  if (it == m.end() || it->second.empty()) return -1;
  for (char c : it->second)
    if (!std::isdigit(static_cast<unsigned char>(c))) return -1;
  return std::stoll(it->second);
}

// ---- Child processes.

struct Child {
  int exit_code = -1;  // -1: did not exit normally
  int signal = 0;
  std::string out, err;
  std::vector<std::string> lines;  // stdout

  // The first stdout line starting with `prefix` ("" if none).
  std::string reply(const std::string& prefix) const {
    for (const std::string& l : lines)
      if (l.compare(0, prefix.size(), prefix) == 0) return l;
    return "";
  }
  // The JSON of the nth (0-based) "stats" reply.
  std::string stats(size_t nth = 0) const {
    for (const std::string& l : lines)
      if (l.rfind("stats {", 0) == 0 && nth-- == 0) return l.substr(6);
    return "";
  }
  // The pointer a "malloc S" reply printed ("" if none or null).
  std::string ptr(char slot) const {
    std::string l = reply(std::string("malloc ") + slot + " ");
    std::string p = l.size() > 9 ? l.substr(9) : "";
    return p == "null" ? "" : p;
  }
  std::string describe() const {
    return "exit " + std::to_string(exit_code) + " signal " + std::to_string(signal) +
           "\n--- stdout\n" + out + "--- stderr\n" + err;
  }
};

class ShimAbi : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "shim_abi_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // The environment every child gets: only what a test adds, plus the
  // sanitizers' options when the tests run under one.
  static std::vector<std::string> base_env() {
    std::vector<std::string> env;
    for (const char* v : {"ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "TSAN_OPTIONS"})
      if (const char* val = std::getenv(v)) env.push_back(std::string(v) + "=" + val);
    return env;
  }

  Child spawn(const std::vector<std::string>& argv, std::vector<std::string> env) {
    const std::vector<std::string> base = base_env();
    env.insert(env.begin(), base.begin(), base.end());
    const int n = ++runs_;
    const fs::path out = dir_ / ("stdout." + std::to_string(n));
    const fs::path err = dir_ / ("stderr." + std::to_string(n));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    std::vector<char*> args, envp;
    std::vector<std::string> argv_copy = argv;
    for (std::string& a : argv_copy) args.push_back(a.data());
    args.push_back(nullptr);
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_t pid = -1;
    int rc = posix_spawn(&pid, args[0], &fa, nullptr, args.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    Child r;
    EXPECT_EQ(rc, 0) << "posix_spawn " << argv[0] << ": " << std::strerror(rc);
    if (rc != 0) return r;
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
    r.out = read_file(out);
    r.err = read_file(err);
    r.lines = split_lines(r.out);
    return r;
  }

  // abi_probe with the simulated driver findable (unless `ld_library_path`
  // says otherwise) and `env` added.
  Child probe(const std::vector<std::string>& cmds, std::vector<std::string> env = {},
              const std::string& ld_library_path = SIM_DRIVER_DIR) {
    std::vector<std::string> argv = {ABI_PROBE, SPILLWAY_LIBRARY};
    argv.insert(argv.end(), cmds.begin(), cmds.end());
    env.push_back("LD_LIBRARY_PATH=" + ld_library_path);
    Child r = spawn(argv, env);
    EXPECT_EQ(r.reply("loaded"), "loaded") << r.describe();
    return r;
  }

  fs::path dir_;
  int runs_ = 0;
};

std::string sz(size_t n) {
  return std::to_string(n);
}

// ---- (1) Loading changes nothing.

TEST_F(ShimAbi, PreloadedIntoTrueIsSilentWithoutAnyDriver) {
#ifdef SHIM_SANITIZED
  GTEST_SKIP() << "a sanitized library cannot be preloaded into an uninstrumented /bin/true";
#endif
  Child r =
      spawn({"/bin/true"}, {std::string("LD_PRELOAD=") + SPILLWAY_LIBRARY, "LD_LIBRARY_PATH="});
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "");
}

TEST_F(ShimAbi, PreloadedWithBadConfigurationIsStillSilentUntilUsed) {
#ifdef SHIM_SANITIZED
  GTEST_SKIP() << "a sanitized library cannot be preloaded into an uninstrumented /bin/true";
#endif
  // spillway.h: configuration is read at the first call.
  Child r = spawn({"/bin/true"},
                  {std::string("LD_PRELOAD=") + SPILLWAY_LIBRARY, "LD_LIBRARY_PATH=" SIM_DRIVER_DIR,
                   "SPILLWAY_GPU_BUDGET=lots", "SPILLWAY_GPU_BUGDET=1"});
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "");
}

// ---- (2) The exports.

TEST_F(ShimAbi, ExportsExactlyTheAbiFunctions) {
  std::string cmd = std::string("nm -D --defined-only '") + SPILLWAY_LIBRARY + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr) << cmd;
  std::string text;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) text.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << cmd << ":\n" << text;
  std::set<std::string> names;
  for (const std::string& line : split_lines(text)) {
    // "0000000000012340 T spillway_malloc"
    std::istringstream ls(line);
    std::string addr, type, name;
    ls >> addr >> type >> name;
    if (name.empty()) continue;
    names.insert(name.substr(0, name.find('@')));
  }
  const std::set<std::string> expected = {
      "spillway_malloc", "spillway_free", "spillway_mark_step", "spillway_stats_json",
      "spillway_pin", "spillway_unpin", "spillway_prefetch", "spillway_check_config",
      "spillway_reset_peak_stats", "spillway_version",
      // NCCL interposition (docs/nccl.md)
      "ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast", "ncclReduce",
      "ncclSend", "ncclRecv", "ncclGroupStart", "ncclGroupEnd"};
  EXPECT_EQ(names, expected) << text;
}

// ---- (3) Bad configuration ends the process at the first call.

TEST_F(ShimAbi, BadBudgetEndsTheProcessAtTheFirstMalloc) {
  Child r = probe({"malloc", "a", sz(4 * MiB)}, {"SPILLWAY_GPU_BUDGET=12parsecs"});
  EXPECT_EQ(r.exit_code, 2) << r.describe();
  EXPECT_EQ(r.reply("malloc"), "") << "spillway_malloc returned";
  EXPECT_TRUE(contains(r.err, "SPILLWAY_GPU_BUDGET")) << r.err;
  EXPECT_TRUE(contains(r.err, "12parsecs")) << r.err;
}

TEST_F(ShimAbi, MisspelledVariableEndsTheProcessWithASuggestion) {
  Child r = probe({"malloc", "a", sz(4 * MiB)}, {"SPILLWAY_GPU_BUGDET=40GiB"});
  EXPECT_EQ(r.exit_code, 2) << r.describe();
  EXPECT_EQ(r.reply("malloc"), "");
  EXPECT_TRUE(contains(r.err, "SPILLWAY_GPU_BUGDET")) << r.err;
  EXPECT_TRUE(contains(r.err, "40GiB")) << r.err;
  EXPECT_TRUE(contains(r.err, "did you mean SPILLWAY_GPU_BUDGET?")) << r.err;
}

// SPILLWAY_MODE=managed through the preloaded shim: the same budget, the same
// bytes, no fallback warning.
TEST_F(ShimAbi, ManagedModeKeepsEveryByteWithinTheBudget) {
  constexpr size_t kBudget = 16 * MiB, kBlock = 4 * MiB;
  std::vector<std::string> cmds;
  const std::string slots = "abcdef";  // 24 MiB live
  for (size_t i = 0; i < slots.size(); ++i) {
    const std::string s(1, slots[i]);
    cmds.insert(cmds.end(), {"malloc", s, sz(kBlock), "fill", s, sz(kBlock), sz(i + 1)});
  }
  for (size_t i = 0; i < slots.size(); ++i)
    cmds.insert(cmds.end(), {"check", std::string(1, slots[i]), sz(kBlock), sz(i + 1)});
  cmds.push_back("stats");
  Child r = probe(cmds, {"SPILLWAY_MODE=managed", "SPILLWAY_GPU_BUDGET=" + sz(kBudget)});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  for (char s : slots)
    EXPECT_EQ(r.reply(std::string("check ") + s), std::string("check ") + s + " ok")
        << r.describe();
  auto m = stats_members(r.stats());
  EXPECT_LE(counter(m, "peak_resident_bytes"), static_cast<long long>(kBudget));
  EXPECT_GE(counter(m, "blocks_evicted"), 2);
  EXPECT_EQ(counter(m, "ooms"), 0);
  EXPECT_FALSE(contains(r.err, "only caches")) << r.err;
}

TEST_F(ShimAbi, StatsDoNotStartTheRuntime) {
  // spillway_stats_json must not start CUDA (runtime.h), nor read the config.
  Child r = probe({"stats"}, {"SPILLWAY_GPU_BUDGET=12parsecs"});
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  auto m = stats_members(r.stats());
  EXPECT_EQ(counter(m, "mallocs"), 0);
  EXPECT_EQ(r.err, "");
}

// ---- (4) Allocation, statistics.

TEST_F(ShimAbi, MallocFreeAndStats) {
  Child r = probe({"malloc", "a", sz(4 * MiB), "stats", "free", "a", sz(4 * MiB), "stats"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.ptr('a'), "") << r.describe();
  auto live = stats_members(r.stats(0));
  EXPECT_EQ(counter(live, "mallocs"), 1);
  EXPECT_EQ(counter(live, "frees"), 0);
  EXPECT_EQ(counter(live, "live_bytes"), static_cast<long long>(4 * MiB));
  EXPECT_GE(counter(live, "resident_bytes"), static_cast<long long>(4 * MiB));
  auto done = stats_members(r.stats(1));
  EXPECT_EQ(counter(done, "mallocs"), 1);
  EXPECT_EQ(counter(done, "frees"), 1);
  EXPECT_EQ(counter(done, "live_bytes"), 0);
  EXPECT_EQ(counter(done, "bad_frees"), 0);
  EXPECT_EQ(counter(done, "ooms"), 0);
  EXPECT_EQ(counter(done, "peak_live_bytes"), static_cast<long long>(4 * MiB));
  for (const char* key : {"steps", "budget_bytes", "host_budget_bytes", "peak_resident_bytes",
                          "bytes_evicted", "bytes_restored", "blocks_evicted", "blocks_restored"})
    EXPECT_GE(counter(done, key), 0) << key << " missing from " << r.stats(1);
}

TEST_F(ShimAbi, SmallAndLargeBlocksAreDistinctAndHoldTheirBytes) {
  Child r = probe({"malloc", "a",         "100",  "malloc", "b",     sz(3 * MiB), "malloc",
                   "c",      "4096",      "fill", "a",      "100",   "1",         "fill",
                   "b",      sz(3 * MiB), "2",    "fill",   "c",     "4096",      "3",
                   "check",  "a",         "100",  "1",      "check", "b",         sz(3 * MiB),
                   "2",      "check",     "c",    "4096",   "3"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  std::set<std::string> ptrs = {r.ptr('a'), r.ptr('b'), r.ptr('c')};
  EXPECT_EQ(ptrs.size(), 3u) << r.describe();
  EXPECT_EQ(ptrs.count(""), 0u) << r.describe();
  for (char s : {'a', 'b', 'c'})
    EXPECT_EQ(r.reply(std::string("check ") + s), std::string("check ") + s + " ok")
        << r.describe();
}

TEST_F(ShimAbi, MarkStepIsCounted) {
  Child r = probe({"step", "step", "step", "stats"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(counter(stats_members(r.stats()), "steps"), 3);
}

TEST_F(ShimAbi, StatsLengthAndTruncation) {
  Child r = probe({"malloc", "a", "4096", "stats", "stats_len", "stats_trunc", "10", "stats_trunc",
                   "1", "stats_trunc", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const std::string full = r.stats();
  stats_members(full);
  const std::string ret = sz(full.size());
  EXPECT_EQ(r.reply("stats_len"), "stats_len " + ret);
  std::vector<std::string> trunc;  // RET GUARD_INTACT TERMINATED CONTENT
  for (const std::string& l : r.lines)
    if (l.rfind("stats_trunc ", 0) == 0) trunc.push_back(l);
  ASSERT_EQ(trunc.size(), 3u) << r.describe();
  EXPECT_EQ(trunc[0], "stats_trunc " + ret + " 1 1 " + full.substr(0, 9));
  EXPECT_EQ(trunc[1], "stats_trunc " + ret + " 1 1 ");  // len 1: only the NUL
  EXPECT_EQ(trunc[2], "stats_trunc " + ret + " 1 0 ");  // len 0: nothing written
}

TEST_F(ShimAbi, StatsFitExactlyInLengthPlusOne) {
  Child r = probe({"malloc", "a", "4096", "stats_len"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const std::string len = r.reply("stats_len ").substr(10);
  ASSERT_FALSE(len.empty());
  const size_t n = std::stoul(len);
  // The state does not change between runs of the same commands: ask again
  // with exactly n + 1 bytes (the JSON and its NUL) and with n (one short).
  Child again =
      probe({"malloc", "a", "4096", "stats", "stats_trunc", sz(n + 1), "stats_trunc", sz(n)});
  ASSERT_EQ(again.exit_code, 0) << again.describe();
  const std::string full = again.stats();
  ASSERT_EQ(full.size(), n);
  EXPECT_EQ(again.lines[again.lines.size() - 2], "stats_trunc " + sz(n) + " 1 1 " + full);
  EXPECT_EQ(again.lines.back(), "stats_trunc " + sz(n) + " 1 1 " + full.substr(0, n - 1));
}

TEST_F(ShimAbi, BudgetFollowsTheEnvironmentAndTheDevice) {
  constexpr long long GiB = 1ll << 30;
  const std::vector<std::string> cmds = {"malloc", "a", "4096", "stats"};
  // The simulated device has 80 GiB: the default leaves 5% (4 GiB).
  Child dflt = probe(cmds);
  EXPECT_EQ(counter(stats_members(dflt.stats()), "budget_bytes"), 76 * GiB) << dflt.describe();
  Child half = probe(cmds, {"SPILLWAY_GPU_BUDGET=50%"});
  EXPECT_EQ(counter(stats_members(half.stats()), "budget_bytes"), 40 * GiB) << half.describe();
  Child fixed = probe(cmds, {"SPILLWAY_GPU_BUDGET=512MiB", "SPILLWAY_HOST_BUDGET=3GiB"});
  auto m = stats_members(fixed.stats());
  EXPECT_EQ(counter(m, "budget_bytes"), 512ll << 20) << fixed.describe();
  EXPECT_EQ(counter(m, "host_budget_bytes"), 3 * GiB) << fixed.describe();
  // A 16 GiB device: 1 GiB of headroom is more than 5%.
  Child small = probe(cmds, {"SIMCUDA_DEVICE_MEMORY=16GiB"});
  EXPECT_EQ(counter(stats_members(small.stats()), "budget_bytes"), 15 * GiB) << small.describe();
}

// The budget counts every byte of device memory spillway holds (docs/config.md):
// with a live set 1.5 times the budget, neither spillway's own count nor the
// driver's ever goes past it, and every block keeps its bytes.
TEST_F(ShimAbi, ResidentBytesStayWithinTheBudgetWhileTheLiveSetExceedsIt) {
  constexpr size_t kBudget = 16 * MiB, kBlock = 4 * MiB;
  std::vector<std::string> cmds;
  const std::string slots = "abcdef";  // 24 MiB live
  for (size_t i = 0; i < slots.size(); ++i) {
    const std::string s(1, slots[i]);
    cmds.insert(cmds.end(), {"malloc", s, sz(kBlock), "fill", s, sz(kBlock), sz(i + 1)});
  }
  cmds.insert(cmds.end(), {"malloc", "x", "1000", "fill", "x", "1000", "99"});  // a small chunk
  for (size_t i = 0; i < slots.size(); ++i)
    cmds.insert(cmds.end(), {"check", std::string(1, slots[i]), sz(kBlock), sz(i + 1)});
  cmds.insert(cmds.end(), {"check", "x", "1000", "99", "stats", "sim_mem"});
  Child r = probe(cmds, {"SPILLWAY_GPU_BUDGET=" + sz(kBudget)});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  for (char s : slots + "x") {
    EXPECT_NE(r.ptr(s), "") << s << "\n" << r.describe();
    EXPECT_EQ(r.reply(std::string("check ") + s), std::string("check ") + s + " ok")
        << r.describe();
  }
  auto m = stats_members(r.stats());
  EXPECT_LE(counter(m, "peak_resident_bytes"), static_cast<long long>(kBudget));
  EXPECT_GE(counter(m, "blocks_evicted"), 3);
  EXPECT_EQ(counter(m, "ooms"), 0);
  unsigned long long used = 0, peak = 0, host = 0;
  ASSERT_EQ(std::sscanf(r.reply("sim_mem ").c_str(), "sim_mem %llu %llu %llu", &used, &peak, &host),
            3)
      << r.describe();
  EXPECT_LE(peak, kBudget) << "the driver saw more device memory than the budget";
  EXPECT_GE(host, 3 * kBlock);
}

// Once a job crosses its budget, host memory is created ahead of its next
// evictions when SPILLWAY_HOST_RESERVE asks (50%: whole 64 MiB pieces, one
// here), and not at all by default; the bytes stay intact either way.
TEST_F(ShimAbi, HostMemoryIsCreatedAheadOnlyWhenAskedForOnceTheBudgetIsCrossed) {
  constexpr size_t kBlock = 4 * MiB;
  std::vector<std::string> cmds;
  for (char s : std::string("abcdef"))  // 24 MiB live under a 16 MiB budget
    cmds.insert(cmds.end(), {"malloc", std::string(1, s), sz(kBlock), "fill", std::string(1, s),
                             sz(kBlock), sz(s)});
  for (char s : std::string("abcdef"))
    cmds.insert(cmds.end(), {"check", std::string(1, s), sz(kBlock), sz(s)});
  const std::vector<std::string> budget = {"SPILLWAY_GPU_BUDGET=16MiB"};
  for (const bool reserve : {true, false}) {
    std::vector<std::string> c = cmds, env = budget;
    c.insert(c.end(), {"ahead", reserve ? "10000" : "200"});
    if (reserve) env.push_back("SPILLWAY_HOST_RESERVE=50%");
    Child r = probe(c, env);
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    for (char s : std::string("abcdef"))
      EXPECT_EQ(r.reply(std::string("check ") + s), std::string("check ") + s + " ok")
          << r.describe();
    EXPECT_EQ(r.reply("ahead "), reserve ? "ahead " + sz(64 * MiB) : "ahead 0") << r.describe();
  }
}

// Host budget reached: no more evictions, the allocation returns NULL, the
// resident set is logged, and no block loses a byte.
TEST_F(ShimAbi, HostBudgetReachedReturnsNullAndLogsTheResidentSet) {
  const std::string blk = sz(4 * MiB);
  Child r = probe(
      {"malloc", "a", blk, "fill", "a",     blk, "1", "malloc", "b",    blk, "fill",  "b", blk, "2",
       "malloc", "c", blk, "fill", "c",     blk, "3", "malloc", "d",    blk, "check", "a", blk, "1",
       "check",  "b", blk, "2",    "check", "c", blk, "3",      "stats"},
      {"SPILLWAY_GPU_BUDGET=8MiB", "SPILLWAY_HOST_BUDGET=4MiB"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  for (char s : {'a', 'b', 'c'}) {
    EXPECT_NE(r.ptr(s), "") << r.describe();
    EXPECT_EQ(r.reply(std::string("check ") + s), std::string("check ") + s + " ok")
        << r.describe();
  }
  EXPECT_EQ(r.reply("malloc d"), "malloc d null") << r.describe();
  auto m = stats_members(r.stats());
  EXPECT_EQ(counter(m, "ooms"), 1);
  EXPECT_EQ(counter(m, "blocks_evicted"), 1);
  EXPECT_LE(counter(m, "peak_host_bytes"), static_cast<long long>(4 * MiB));
  EXPECT_TRUE(contains(r.err, "host budget")) << r.err;
  // The OOM line names the limit that bound and the setting to change, in human sizes.
  EXPECT_TRUE(contains(r.err, "allocation of 4.0 MiB failed: the host budget is full")) << r.err;
  EXPECT_TRUE(contains(r.err, "SPILLWAY_HOST_BUDGET=4.0 MiB")) << r.err;
  EXPECT_TRUE(contains(r.err, "raise SPILLWAY_HOST_BUDGET")) << r.err;
  // The resident blocks are listed, by address.
  EXPECT_GE(
      count_lines_with(r.err, r.ptr('b').substr(2)) + count_lines_with(r.err, r.ptr('c').substr(2)),
      1u)
      << r.err;
}

// A full host budget fails every allocation that needs an eviction: its
// warning is logged the 1st, 2nd, 4th and 8th time, with the count, not at
// every allocation (issue 13: 17 times in 3 steps). Each OOM line stays.
TEST_F(ShimAbi, AWarningRepeatedAtEveryAllocationIsLoggedAtPowersOfTwo) {
  const std::string blk = sz(4 * MiB);
  std::vector<std::string> cmds = {"malloc", "a", blk, "malloc", "b", blk, "malloc", "c", blk};
  for (char s = 'd'; s <= 'k'; ++s) cmds.insert(cmds.end(), {"malloc", std::string(1, s), blk});
  Child r = probe(cmds, {"SPILLWAY_GPU_BUDGET=8MiB", "SPILLWAY_HOST_BUDGET=4MiB"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  for (char s = 'd'; s <= 'k'; ++s)
    EXPECT_EQ(r.reply(std::string("malloc ") + s), std::string("malloc ") + s + " null");
  EXPECT_EQ(count_lines_with(r.err, "allocation of 4.0 MiB failed"), 8u) << r.err;
  EXPECT_EQ(count_lines_with(r.err, "host budget of 4.0 MiB reached"), 4u) << r.err;
  EXPECT_EQ(count_lines_with(r.err, "(seen 8 times; repeats are logged at powers of two)"), 2u)
      << r.err;  // the host budget's warning and the "cannot fit" one
}

// A budget filled by small blocks (under SPILLWAY_MIN_BLOCK, which never
// move): a large allocation fails, and the OOM line says that the small-block
// pool is what bound, and what to set (issue 15: a U-Net at 30% of its peak).
TEST_F(ShimAbi, SmallBlocksFillingTheBudgetAreNamedInTheOomLine) {
  std::vector<std::string> cmds;
  const std::string small = sz(512 * 1024);
  for (char s = 'a'; s <= 'p'; ++s) {  // 16 x 512 KiB: 8 MiB of small-block chunks
    cmds.insert(cmds.end(), {"malloc", std::string(1, s), small});
  }
  cmds.insert(cmds.end(), {"malloc", "z", sz(4 * MiB), "stats"});
  Child r = probe(cmds, {"SPILLWAY_GPU_BUDGET=8MiB"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.ptr('a'), "") << r.describe();
  EXPECT_EQ(r.reply("malloc z"), "malloc z null") << r.describe();
  EXPECT_TRUE(contains(r.err, "allocation of 4.0 MiB failed: the small-block pool")) << r.err;
  EXPECT_TRUE(contains(r.err, "SPILLWAY_MIN_BLOCK=1.0 MiB")) << r.err;
  EXPECT_TRUE(contains(r.err, "lower SPILLWAY_MIN_BLOCK")) << r.err;
}

// Issue 3, item 5: "if the device is truly full (other processes, the budget
// unreachable) it evicts too rather than fail". A 16 MiB device, a budget of
// all of it, 12 MiB live in spillway and 4 MiB taken by another process.
std::vector<std::string> fill_the_device() {
  const std::string blk = sz(4 * MiB);
  return {"malloc", "a", blk,      "fill", "a", blk,    "1", "malloc", "b", blk,        "fill", "b",
          blk,      "2", "malloc", "c",    blk, "fill", "c", blk,      "3", "external", blk};
}
const std::vector<std::string> kSmallDevice = {"SIMCUDA_DEVICE_MEMORY=16MiB",
                                               "SPILLWAY_GPU_BUDGET=100%"};

TEST_F(ShimAbi, DeviceFilledByAnotherProcessLargeAllocationEvicts) {
  std::vector<std::string> cmds = fill_the_device();
  const std::string blk = sz(4 * MiB);
  cmds.insert(cmds.end(),
              {"malloc", "d", blk, "fill",  "d", blk, "4", "check", "a", blk, "1", "check",
               "b",      blk, "2", "check", "c", blk, "3", "check", "d", blk, "4", "stats"});
  Child r = probe(cmds, kSmallDevice);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  ASSERT_EQ(r.reply("external"), "external ok") << r.describe();
  EXPECT_NE(r.ptr('d'), "") << r.describe();
  for (char s : {'a', 'b', 'c', 'd'})
    EXPECT_EQ(r.reply(std::string("check ") + s), std::string("check ") + s + " ok")
        << r.describe();
  EXPECT_GE(counter(stats_members(r.stats()), "blocks_evicted"), 1);
}

TEST_F(ShimAbi, DeviceFilledByAnotherProcessSmallAllocationEvicts) {
  // A small block needs a new 2 MiB chunk: 14 MiB is within the budget, but
  // the device has nothing left until a large block is evicted.
  std::vector<std::string> cmds = fill_the_device();
  const std::string blk = sz(4 * MiB);
  cmds.insert(cmds.end(),
              {"malloc", "x",     "1000", "fill", "x", "1000",  "9", "check", "a", blk,
               "1",      "check", "b",    blk,    "2", "check", "c", blk,     "3", "stats"});
  Child r = probe(cmds, kSmallDevice);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  ASSERT_EQ(r.reply("external"), "external ok") << r.describe();
  EXPECT_NE(r.ptr('x'), "") << r.describe();
  for (char s : {'a', 'b', 'c'})
    EXPECT_EQ(r.reply(std::string("check ") + s), std::string("check ") + s + " ok")
        << r.describe();
  EXPECT_EQ(counter(stats_members(r.stats()), "ooms"), 0);
}

// ---- (5) Bad frees: logged, counted, ignored.

// The VA arena asks for room for the device's memory four times over plus
// twice the host budget (staging ranges). A process that cannot have that
// much (ulimit -v, a sanitizer's layout) gets less, down to the first part,
// and still allocates, evicts and restores every byte.
TEST_F(ShimAbi, ALimitedAddressSpaceGetsASmallerArenaAndStillWorks) {
#ifdef SHIM_SANITIZED
  GTEST_SKIP() << "a sanitizer's shadow memory does not fit under the address-space limit";
#else
  const std::string blk = sz(4 * MiB);
  const std::vector<std::string> cmds = {
      "malloc", "a",     blk, "fill", "a",      blk,     "1", "malloc", "b", blk,
      "fill",   "b",     blk, "2",    "malloc", "c",     blk, "fill",   "c", blk,
      "3",      "check", "a", blk,    "1",      "check", "b", blk,      "2", "stats"};
  // 1 GiB device: the arena's floor is 64 GiB; the 1 TiB host budget asks
  // for 2 TiB more, above the 256 GiB the child may map.
  rlimit old{};
  ASSERT_EQ(0, getrlimit(RLIMIT_AS, &old));
  rlimit lim = old;
  lim.rlim_cur = 256ull << 30;
  ASSERT_EQ(0, setrlimit(RLIMIT_AS, &lim));
  Child r = probe(cmds, {"SIMCUDA_DEVICE_MEMORY=1GiB", "SPILLWAY_GPU_BUDGET=8MiB",
                         "SPILLWAY_HOST_BUDGET=1TiB"});
  ASSERT_EQ(0, setrlimit(RLIMIT_AS, &old));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.ptr('c'), "") << r.describe();
  EXPECT_EQ(r.reply("check a"), "check a ok") << r.describe();
  EXPECT_EQ(r.reply("check b"), "check b ok") << r.describe();
  EXPECT_GE(counter(stats_members(r.stats()), "blocks_evicted"), 1) << r.describe();
#endif
}

// Under torchrun (RANK set) every line says which rank and process wrote
// it; a job outside one keeps the short form.
TEST_F(ShimAbi, LogLinesNameTheRankAndPidUnderTorchrun) {
  Child ranked = probe({"malloc", "a", sz(4096), "free_unknown", "4096"}, {"RANK=2"});
  ASSERT_EQ(ranked.exit_code, 0) << ranked.describe();
  EXPECT_TRUE(contains(ranked.err, "[spillway E rank 2 pid ")) << ranked.err;
  EXPECT_FALSE(contains(ranked.err, "[spillway E] ")) << ranked.err;
  Child alone = probe({"malloc", "a", sz(4096), "free_unknown", "4096"}, {});
  ASSERT_EQ(alone.exit_code, 0) << alone.describe();
  EXPECT_TRUE(contains(alone.err, "[spillway E] free of 0x1000")) << alone.err;
}

// A free that names another device than the allocation's is a caller's
// bug: it is refused by name, and neither device's block is touched.
TEST_F(ShimAbi, AFreeOnAnotherDeviceIsRefusedByNameAndLosesNothing) {
  Child r = probe({"malloc",  "a",     sz(4 * MiB), "fill", "a",         sz(4 * MiB), "9",
                   "free_on", "a",     sz(4 * MiB), "1",    "check",     "a",         sz(4 * MiB),
                   "9",       "stats", "free",      "a",    sz(4 * MiB), "stats"},
                  {"SIMCUDA_DEVICE_COUNT=2"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(r.err, "freed on device 1, but allocated on device 0; ignored")) << r.err;
  EXPECT_FALSE(contains(r.err, "not a live spillway allocation")) << r.err;
  EXPECT_EQ(r.reply("check a"), "check a ok") << r.describe();
  auto m = stats_members(r.stats(0));
  EXPECT_EQ(counter(m, "bad_frees"), 1);
  EXPECT_EQ(counter(m, "live_bytes"), static_cast<long long>(4 * MiB));
  // Still live on its own device, it frees normally there.
  auto after = stats_members(r.stats(1));
  EXPECT_EQ(counter(after, "frees"), 1);
  EXPECT_EQ(counter(after, "live_bytes"), 0);
}

TEST_F(ShimAbi, FreeOfAnUnknownPointerIsLoggedCountedAndIgnored) {
  Child r =
      probe({"malloc",       "a",    sz(4 * MiB),  "fill", "a",         sz(4 * MiB), "7",
             "free_unknown", "4096", "free_inner", "a",    sz(4 * MiB), "check",     "a",
             sz(4 * MiB),    "7",    "stats",      "free", "a",         sz(4 * MiB), "stats"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.reply("check a"), "check a ok") << r.describe();
  auto m = stats_members(r.stats(0));
  EXPECT_EQ(counter(m, "bad_frees"), 2);
  EXPECT_EQ(counter(m, "frees"), 0);
  EXPECT_EQ(counter(m, "live_bytes"), static_cast<long long>(4 * MiB));
  // The block itself is still live and frees normally.
  auto after = stats_members(r.stats(1));
  EXPECT_EQ(counter(after, "frees"), 1);
  EXPECT_EQ(counter(after, "bad_frees"), 2);
  const std::string inner = r.reply("free_inner a ").substr(13);
  EXPECT_EQ(count_lines_with(r.err, "0x1000 "), 1u) << r.err;
  EXPECT_EQ(count_lines_with(r.err, inner), 1u) << inner << "\n" << r.err;
}

TEST_F(ShimAbi, DoubleFreeIsLoggedCountedAndIgnored) {
  // A live block (a) next to the doubly freed ones: a large one (b) and a
  // small one (c).
  Child r = probe({"malloc", "a",         sz(4 * MiB), "fill",      "a",   sz(4 * MiB), "9",
                   "malloc", "b",         sz(2 * MiB), "malloc",    "c",   "512",       "fill",
                   "c",      "512",       "4",         "free",      "b",   sz(2 * MiB), "free",
                   "b",      sz(2 * MiB), "free",      "c",         "512", "free",      "c",
                   "512",    "check",     "a",         sz(4 * MiB), "9",   "stats"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.reply("check a"), "check a ok") << r.describe();
  auto m = stats_members(r.stats());
  EXPECT_EQ(counter(m, "bad_frees"), 2);
  EXPECT_EQ(counter(m, "frees"), 2);
  EXPECT_EQ(counter(m, "live_bytes"), static_cast<long long>(4 * MiB));
  for (char s : {'b', 'c'}) {
    ASSERT_NE(r.ptr(s), "");
    EXPECT_EQ(count_lines_with(r.err, r.ptr(s) + " "), 1u) << r.err;
  }
  EXPECT_TRUE(contains(r.err, "double free")) << r.err;
}

TEST_F(ShimAbi, SizeMismatchIsLoggedCountedAndIgnored) {
  Child r =
      probe({"malloc", "a",    sz(4 * MiB), "fill", "a",     sz(4 * MiB), "5",         "malloc",
             "b",      "3000", "fill",      "b",    "3000",  "6",         "free",      "a",
             "1000",   "free", "b",         "3001", "check", "a",         sz(4 * MiB), "5",
             "check",  "b",    "3000",      "6",    "stats", "free",      "a",         sz(4 * MiB),
             "free",   "b",    "3000",      "stats"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.reply("check a"), "check a ok") << r.describe();
  EXPECT_EQ(r.reply("check b"), "check b ok") << r.describe();
  auto m = stats_members(r.stats(0));
  EXPECT_EQ(counter(m, "bad_frees"), 2);
  EXPECT_EQ(counter(m, "frees"), 0);
  EXPECT_EQ(counter(m, "live_bytes"), static_cast<long long>(4 * MiB + 3000));
  auto after = stats_members(r.stats(1));
  EXPECT_EQ(counter(after, "frees"), 2);
  EXPECT_EQ(counter(after, "live_bytes"), 0);
  // The message names the pointer and both sizes.
  for (const auto& [s, wrong, right] :
       {std::tuple{'a', "1000", sz(4 * MiB)}, std::tuple{'b', "3001", std::string("3000")}}) {
    bool found = false;
    for (const std::string& l : split_lines(r.err))
      found |= contains(l, r.ptr(s) + " ") && contains(l, wrong) && contains(l, right);
    EXPECT_TRUE(found) << s << ":\n" << r.err;
  }
}

// ---- (6) No driver.

TEST_F(ShimAbi, WithoutADriverMallocReturnsNullAndOneErrorIsLogged) {
  fs::create_directories(dir_ / "empty");
  Child r = probe({"malloc", "a", sz(4 * MiB), "malloc", "b", "4096", "free", "a", sz(4 * MiB),
                   "step", "stats"},
                  {}, (dir_ / "empty").string());
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.reply("malloc a"), "malloc a null") << r.describe();
  EXPECT_EQ(r.reply("malloc b"), "malloc b null") << r.describe();
  EXPECT_EQ(count_lines_with(r.err, "libcuda.so.1"), 1u) << r.err;
  auto m = stats_members(r.stats());
  EXPECT_EQ(counter(m, "mallocs"), 0);
  EXPECT_EQ(counter(m, "steps"), 1);
}

// stats.h: "ooms: malloc returned NULL". Without a driver every malloc
// returns NULL, and the exit summary should not say "0 OOM".
TEST_F(ShimAbi, WithoutADriverEveryNullIsCountedAsAnOom) {
  fs::create_directories(dir_ / "empty");
  Child r = probe({"malloc", "a", sz(4 * MiB), "malloc", "b", "4096", "stats"}, {},
                  (dir_ / "empty").string());
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(counter(stats_members(r.stats()), "ooms"), 2) << r.stats();
  EXPECT_EQ(count_lines_with(r.err, "2 OOM"), 1u) << r.err;
}

// ---- (7) At exit: the summary line, SPILLWAY_STATS, SPILLWAY_LOG_FILE.

TEST_F(ShimAbi, SummaryLineAndStatsFileAtExit) {
  const fs::path stats = dir_ / "stats.json";
  Child r = probe({"malloc", "a", sz(4 * MiB), "malloc", "b", "100", "free", "b", "100", "free",
                   "a", sz(4 * MiB), "step"},
                  {"SPILLWAY_STATS=" + stats.string(), "SPILLWAY_GPU_BUDGET=1GiB"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  // 4 MiB block + one 2 MiB small-block chunk.
  EXPECT_EQ(count_lines_with(r.err, "peak resident 6.0 MiB (budget 1.0 GiB)"), 1u) << r.err;
  EXPECT_EQ(count_lines_with(r.err, "waited 0 us for transfers"), 1u) << r.err;  // none moved
  ASSERT_TRUE(fs::exists(stats)) << r.describe();
  std::string json = read_file(stats);
  while (!json.empty() && json.back() == '\n') json.pop_back();
  auto m = stats_members(json);
  EXPECT_EQ(counter(m, "mallocs"), 2);
  EXPECT_EQ(counter(m, "frees"), 2);
  EXPECT_EQ(counter(m, "steps"), 1);
  EXPECT_EQ(counter(m, "budget_bytes"), 1ll << 30);
  EXPECT_EQ(counter(m, "peak_resident_bytes"), static_cast<long long>(6 * MiB));
}

TEST_F(ShimAbi, NoSummaryWhenTheAbiWasNeverUsed) {
  const fs::path stats = dir_ / "stats.json";
  Child r = probe({}, {"SPILLWAY_STATS=" + stats.string()});
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.err, "");
  EXPECT_FALSE(fs::exists(stats));
}

TEST_F(ShimAbi, LogFileReceivesTheLogInsteadOfStderr) {
  const fs::path log = dir_ / "spillway.log";
  Child r = probe({"malloc", "a", sz(4 * MiB), "free_unknown", "64"},
                  {"SPILLWAY_LOG_FILE=" + log.string()});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.err, "");
  const std::string text = read_file(log);
  EXPECT_EQ(count_lines_with(text, "peak resident"), 1u) << text;
  EXPECT_EQ(count_lines_with(text, "0x1000 "), 1u) << text;
}

TEST_F(ShimAbi, UnopenableLogFileFallsBackToStderrWithAWarning) {
  // A path below a regular file: no directory can be created there.
  std::ofstream(dir_ / "file") << "x";
  const fs::path log = dir_ / "file" / "spillway.log";
  Child r = probe({"malloc", "a", sz(4 * MiB)}, {"SPILLWAY_LOG_FILE=" + log.string()});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.ptr('a'), "") << r.describe();
  EXPECT_EQ(count_lines_with(r.err, "SPILLWAY_LOG_FILE"), 1u) << r.err;
  EXPECT_EQ(count_lines_with(r.err, "peak resident"), 1u) << r.err;
}

TEST_F(ShimAbi, UnwritableStatsFileIsLoggedAndTheExitCodeKept) {
  std::ofstream(dir_ / "file") << "x";
  const fs::path stats = dir_ / "file" / "stats.json";
  Child r = probe({"malloc", "a", sz(4 * MiB)}, {"SPILLWAY_STATS=" + stats.string()});
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(count_lines_with(r.err, "SPILLWAY_STATS"), 1u) << r.err;
  EXPECT_EQ(count_lines_with(r.err, "peak resident"), 1u) << r.err;
}

TEST_F(ShimAbi, ZeroAndHugeSizesAreRefusedByNameAndLoseNothing) {
  // Issue 15 item 3. 0 bytes: null, as PyTorch's allocator, and no OOM. A
  // size whose rounding to the granule would wrap around: one line saying
  // no device has that much, not a driver error for a 0-byte create. Beyond
  // the budget: the budget named. The process goes on allocating.
  Child r = probe({"malloc",    "a",     "0",
                   "malloc",    "b",     "18446744073709551615",
                   "malloc",    "c",     sz(1000ull << 40),
                   "malloc",    "d",     sz(4 * MiB),
                   "fill",      "d",     sz(4 * MiB),
                   "7",         "check", "d",
                   sz(4 * MiB), "7",     "stats"},
                  {"SPILLWAY_GPU_BUDGET=1GiB"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.ptr('a'), "") << r.describe();  // "" is a null reply
  EXPECT_EQ(r.ptr('b'), "") << r.describe();
  EXPECT_EQ(r.ptr('c'), "") << r.describe();
  EXPECT_NE(r.ptr('d'), "") << r.describe();
  EXPECT_NE(r.out.find("check d ok"), std::string::npos) << r.describe();
  EXPECT_EQ(count_lines_with(r.err, "larger than any device's memory"), 1u) << r.err;
  EXPECT_EQ(count_lines_with(r.err, "cuMemCreate"), 0u) << r.err;
  EXPECT_EQ(count_lines_with(r.err,
                             "allocation of 1000.0 TiB failed: it does not fit in the GPU "
                             "budget (SPILLWAY_GPU_BUDGET=1.0 GiB)"),
            1u)
      << r.err;
  EXPECT_EQ(counter(stats_members(r.stats()), "ooms"), 2);
}

TEST_F(ShimAbi, OutputPathsAreCheckedAtTheStartAndAnotherUsersLinkIsNeverFollowed) {
  // Issue 15 item 3: a stats file in a missing directory is said at the
  // start (the log's first line), not after the job; a record path that is
  // another user's symbolic link (a shared /tmp) is refused by name and the
  // file it points to is left alone.
  const fs::path target = dir_ / "precious.txt";
  std::ofstream(target) << "keep me";
  const fs::path link = dir_ / "job.spwt";
  fs::create_symlink(target, link);
  const bool other = ::lchown(link.c_str(), 4242, 4242) == 0;
  Child r = probe({"malloc", "a", sz(4 * MiB)},
                  {"SPILLWAY_STATS=" + (dir_ / "missing" / "stats.json").string(),
                   "SPILLWAY_RECORD=" + link.string()});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.ptr('a'), "") << r.describe();
  const std::string first = r.err.substr(0, r.err.find('\n'));
  EXPECT_NE(first.find("cannot write SPILLWAY_STATS file"), std::string::npos) << r.err;
  EXPECT_NE(first.find("its directory '" + (dir_ / "missing").string() + "' does not exist"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(count_lines_with(r.err, "SPILLWAY_STATS"), 1u) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "missing"));
  if (!other) GTEST_SKIP() << "cannot give the link to another user here (needs root)";
  EXPECT_EQ(count_lines_with(r.err, "cannot write SPILLWAY_RECORD file '" + link.string() +
                                        "' (it is a symbolic link of another user (uid 4242)"),
            1u)
      << r.err;
  EXPECT_EQ(read_file(target), "keep me");
}

}  // namespace
