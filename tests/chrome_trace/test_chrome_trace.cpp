// SPILLWAY_TRACE: the real libspillway.so in child processes (trace_probe)
// over the simulated GPU, checked with python3's json module
// (check_trace.py); and the writer's bounds in-process.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "chrome_events.h"
#include "chrome_trace.h"
#include "json.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Summary = std::map<std::string, long long>;

// The summary check_trace.py prints; {"error": 1} if the file does not parse.
Summary check(const std::string& path, bool tolerant, bool quiet = false) {
  std::string cmd = std::string("/usr/bin/python3 ") + CHECK_TRACE_PY + " '" + path + "'" +
                    (tolerant ? " --tolerant" : "") + " 2>&1";
  Summary s;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {{"error", 1}};
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) {
    std::istringstream in(buf);
    std::string k;
    long long v = 0;
    in >> k;
    if (k == "error") {
      s["error"] = 1;
      if (!quiet) std::fprintf(stderr, "check_trace: %s", buf);
      continue;
    }
    in >> v;
    s[k] = v;
  }
  const int st = pclose(p);
  if (st != 0) s["error"] = 1;
  return s;
}

long long json_number(const std::string& json, const std::string& key) {
  const std::string k = "\"" + key + "\":";
  const size_t at = json.find(k);
  if (at == std::string::npos) return -1;
  return std::atoll(json.c_str() + at + k.size());
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class Child {
 public:
  Child(const std::vector<std::string>& args, const std::vector<std::string>& env) {
    std::vector<std::string> e;
    auto overridden = [&](const char* v) {
      for (const auto& x : env)
        if (x.compare(0, x.find('=') + 1, v, std::strcspn(v, "=") + 1) == 0) return true;
      return false;
    };
    for (char** v = environ; *v; ++v)
      if (std::strncmp(*v, "SPILLWAY_", 9) != 0 && std::strncmp(*v, "SIMCUDA_", 8) != 0 &&
          !overridden(*v))
        e.emplace_back(*v);
    e.insert(e.end(), env.begin(), env.end());
    int p[2];
    if (pipe(p) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(p[1], 1);
      close(p[0]);
      close(p[1]);
      std::vector<char*> argv, envp;
      for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      for (auto& x : e) envp.push_back(const_cast<char*>(x.c_str()));
      envp.push_back(nullptr);
      execve(argv[0], argv.data(), envp.data());
      _exit(127);
    }
    close(p[1]);
    out_ = fdopen(p[0], "r");
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_) fclose(out_);
  }
  // The next line of the child's stdout ("" at its end).
  std::string line() {
    char buf[8192];
    if (!out_ || !std::fgets(buf, sizeof buf, out_)) return "";
    std::string s = buf;
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  void signal(int sig) { kill(pid_, sig); }
  int wait() {
    int st = 0;
    waitpid(pid_, &st, 0);
    reaped_ = true;
    return st;
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  FILE* out_ = nullptr;
};

class ChromeTraceRun : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/chrome_trace_XXXXXX";
    ASSERT_NE(nullptr, mkdtemp(tmpl));
    dir_ = tmpl;
    trace_ = dir_ + "/trace.json";
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  std::vector<std::string> env(const std::string& budget = "16MiB") {
    return {"SPILLWAY_TRACE=" + trace_, "SPILLWAY_GPU_BUDGET=" + budget,
            "SPILLWAY_CUPTI_PATH=" SIM_CUPTI, "SPILLWAY_STATS=" + dir_ + "/stats.json",
            "SPILLWAY_LOG_FILE=" + dir_ + "/spillway.log"};
  }
  std::vector<std::string> probe(const std::string& mode, const std::string& n = "") {
    std::vector<std::string> a = {TRACE_PROBE, TRACE_TEST_LIBRARY, mode};
    if (!n.empty()) a.push_back(n);
    return a;
  }
  // Reads "stats {...}" from the probe.
  std::string stats_line(Child& c) {
    std::string l = c.line();
    EXPECT_EQ(0u, l.rfind("stats ", 0)) << l;
    return l.size() > 6 ? l.substr(6) : "";
  }
  // What the trace of the probe's job (8 blocks x 3 rounds of launches, a
  // memset, a memcpy) must show: the unmet expectations, empty when it all
  // holds. A bool, not assertions, so a test can also wait for it.
  static std::string job_mismatches(const Summary& s, const std::string& stats) {
    auto at = [&](const char* k) {
      auto it = s.find(k);
      return it == s.end() ? -1000000 : it->second;
    };
    std::string bad;
    auto need = [&](bool ok, const char* what) {
      if (!ok) bad += std::string(what) + "; ";
    };
    need(!s.count("error"), "the trace parses");
    need(at("kernels") == 24, "24 kernels");
    need(at("kernels") == at("kernels_device_clock"), "every kernel on the device clock");
    need(at("kernels_bad_time") == 0, "no kernel with a bad time");
    need(at("memsets") >= 1, "a memset");
    need(at("memcpys") >= 1, "a memcpy");
    need(at("stream_tracks") >= 1, "a stream track");
    need(at("direction_tracks") == 2, "two direction tracks");
    need(at("simulated") == 1, "marked simulated");
    need(at("versioned") == 1 && at("schema") == 1, "spillway's version and JSON schema");
    // Every transfer spillway counted is in the trace, with its cause and
    // block, on the device clock (joined to its activity record).
    need(at("evictions") > 0 && at("restores") > 0, "evictions and restores");
    need(json_number(stats, "bytes_evicted") == at("bytes_evicted"), "bytes evicted as counted");
    need(json_number(stats, "bytes_restored") == at("bytes_restored"), "bytes restored as counted");
    need(json_number(stats, "blocks_evicted") == at("evictions"), "evictions as counted");
    need(json_number(stats, "blocks_restored") == at("restores"), "restores as counted");
    need(at("evictions") + at("restores") == at("transfers_device_clock"),
         "every transfer on the device clock");
    need(at("evictions") + at("restores") == at("transfers_with_cause"),
         "every transfer with its cause");
    // Restores made for a launch name the launch's correlation id.
    need(at("restores") == at("restores_for_a_call"), "restores name their launch");
    // The budget holds at every sample.
    need(at("memory_samples") > 0, "memory samples");
    need(at("max_resident_minus_budget") <= 0, "resident within the budget at every sample");
    return bad;
  }
  // Runs the probe's job to its exit and parses the (closed) trace it left.
  void run_job(const std::vector<std::string>& e, std::string* stats, Summary* s) {
    Child c(probe("run"), e);
    *stats = stats_line(c);
    const int st = c.wait();
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
    *s = check(trace_, false);
    ASSERT_EQ(0u, s->count("error"));
  }
  void expect_job(const Summary& s, const std::string& stats) {
    std::string dump;
    for (const auto& [k, v] : s) dump += k + "=" + std::to_string(v) + " ";
    EXPECT_EQ("", job_mismatches(s, stats)) << "summary: " << dump << "stats: " << stats;
  }

  std::string dir_, trace_;
};

// The one escape of every JSON spillway writes by hand (base/json.h): any
// name stays a valid JSON string body.
TEST(JsonEscape, QuotesBackslashesAndControlCharactersAreEscaped) {
  using spillway::json_escape;
  EXPECT_EQ(json_escape("plain_kernel<float>"), "plain_kernel<float>");
  EXPECT_EQ(json_escape(R"(a"b\c)"), R"(a\"b\\c)");
  EXPECT_EQ(json_escape(std::string("t\tab\nnl\x01\x1f", 9)), "t\\u0009ab\\u000anl\\u0001\\u001f");
  EXPECT_EQ(json_escape(std::string("nul\0in", 6)), "nul\\u0000in");
  EXPECT_EQ(json_escape("caf\xc3\xa9"), "caf\xc3\xa9") << "UTF-8 passes unchanged";
  EXPECT_EQ(json_escape("abcdef", 3), "abc") << "cut at max bytes of the input";
  EXPECT_EQ(json_escape("\"\"", 1), "\\\"");
}

// The file format both trace writers share (base/chrome_events.h): '[',
// one event per line, each after the first starting with ',', lines out
// whole when the buffer fills, so that a file cut between writes is the
// array's beginning; close() ends it.
TEST(ChromeEventWriter, WritesWholeLinesAndClosesTheArray) {
  const std::string path = ::testing::TempDir() + "/events.json";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  spillway::ChromeEventWriter w(fd, 0);  // raised to two events' room
  EXPECT_GE(w.buffer_bytes(), 2 * spillway::ChromeEventWriter::kMaxEvent);
  w.process_name(1, "GPU \"0\"");
  w.thread_name(1, 7, "stream 7");
  w.thread_sort_index(1, 7, -2);
  const std::string pad(1000, 'x');
  for (int i = 0; i < 40; ++i)
    w.event(
        "{\"name\":\"e%d\",\"ph\":\"X\",\"pid\":1,\"tid\":7,\"ts\":%s,\"dur\":1.000,\"args\":{"
        "\"pad\":\"%s\"}}",
        i, spillway::ChromeEventWriter::micros(1000ull * i).c_str(), pad.c_str());
  // Some went out already, in whole lines: the file so far is the array's
  // beginning.
  const std::string cut = read_file(path);
  ASSERT_GT(cut.size(), 0u);
  EXPECT_EQ(cut.size(), w.bytes_written());
  EXPECT_EQ('[', cut.front());
  EXPECT_EQ('\n', cut.back());
  EXPECT_LE(w.buffered_peak(), w.buffer_bytes());
  ASSERT_TRUE(w.close());
  EXPECT_TRUE(w.closed());
  w.event("{\"name\":\"late\"}");  // dropped
  const std::string all = read_file(path);
  EXPECT_EQ(all.size(), w.bytes_written());
  EXPECT_EQ(0u, all.compare(0, cut.size(), cut)) << "written before, unchanged";
  std::istringstream lines(all);
  std::string line;
  std::vector<std::string> got;
  while (std::getline(lines, line)) got.push_back(line);
  ASSERT_EQ(3u + 40u + 1u, got.size());
  EXPECT_EQ(R"([{"name":"process_name","ph":"M","pid":1,"args":{"name":"GPU \"0\""}})", got[0]);
  EXPECT_EQ(R"(,{"name":"thread_name","ph":"M","pid":1,"tid":7,"args":{"name":"stream 7"}})",
            got[1]);
  EXPECT_EQ(R"(,{"name":"thread_sort_index","ph":"M","pid":1,"tid":7,"args":{"sort_index":-2}})",
            got[2]);
  for (int i = 0; i < 40; ++i)
    EXPECT_EQ(0u, got[3 + i].find(",{\"name\":\"e" + std::to_string(i) + "\"")) << i;
  EXPECT_NE(std::string::npos, got[3 + 39].find("\"ts\":39.000,"));
  EXPECT_EQ("]", got.back());
  EXPECT_EQ(all.find("late"), std::string::npos);
  EXPECT_EQ("1234.567", spillway::ChromeEventWriter::micros(1234567));
  EXPECT_EQ("0.005", spillway::ChromeEventWriter::micros(5));
}

// A write that fails (a full disk) ends the file, not the writer's owner:
// close() says so with the error, and nothing more is written.
TEST(ChromeEventWriter, AFailedWriteEndsTheFileAndCloseSaysSo) {
  const int fd = ::open("/dev/full", O_WRONLY);
  if (fd < 0) GTEST_SKIP() << "no /dev/full";
  spillway::ChromeEventWriter w(fd, 0);
  w.event("{\"name\":\"a\"}");
  w.flush();
  EXPECT_EQ(ENOSPC, w.error());
  w.event("{\"name\":\"b\"}");
  EXPECT_FALSE(w.close());
  EXPECT_EQ(0u, w.bytes_written());
}

TEST_F(ChromeTraceRun, EvictionRunMatchesTheStatistics) {
  std::string stats;
  Summary s;
  ASSERT_NO_FATAL_FAILURE(run_job(env(), &stats, &s));
  EXPECT_EQ(1, s.at("closed"));
  EXPECT_EQ(1, s.at("has_start"));
  EXPECT_EQ(1, s.at("has_end"));
  expect_job(s, stats);
  EXPECT_EQ(0, s.at("transfers_with_site")) << "sites without SPILLWAY_STACKS";
  // The stats file at exit says the same.
  const std::string at_exit = read_file(dir_ + "/stats.json");
  EXPECT_EQ(json_number(at_exit, "bytes_evicted"), s.at("bytes_evicted"));
  EXPECT_EQ(0, s.at("end_events_dropped"));
  EXPECT_EQ(0, s.at("end_records_dropped"));
  EXPECT_EQ(0, s.at("end_buffers_cut"));
  EXPECT_EQ(s.at("kernels"), s.at("end_kernels"));
  // The exit summary names the file and what it holds.
  const std::string log = read_file(dir_ + "/spillway.log");
  EXPECT_NE(std::string::npos, log.find("trace " + trace_ + ": 24 kernels")) << log;
  EXPECT_NE(std::string::npos, log.find("times are simulated")) << log;
}

// A buffer CUPTI cannot read to its end (cuptiActivityGetNextRecord failing
// before the buffer's end, SIMCUPTI_FAIL) loses the records after the
// failure: the trace still closes and loads, its end event counts the
// buffer, and the exit summary says that something was dropped.
TEST_F(ChromeTraceRun, AnActivityBufferCuptiCannotReadToItsEndIsCounted) {
  auto e = env();
  e.push_back("SIMCUPTI_FAIL=cuptiActivityGetNextRecord:3");
  std::string stats;
  Summary s;
  ASSERT_NO_FATAL_FAILURE(run_job(e, &stats, &s));
  EXPECT_EQ(1, s.at("closed"));
  EXPECT_GE(s.at("end_buffers_cut"), 1);
  const std::string log = read_file(dir_ + "/spillway.log");
  EXPECT_NE(std::string::npos, log.find("some events were dropped (see the end event)")) << log;
}

// SPILLWAY_STACKS=1: every eviction and restore names its block's allocation
// site, so a trace viewer can sum the bytes moved by site.
TEST_F(ChromeTraceRun, WithStacksEveryTransferNamesItsAllocationSite) {
  auto e = env();
  e.push_back("SPILLWAY_STACKS=1");
  std::string stats;
  Summary s;
  ASSERT_NO_FATAL_FAILURE(run_job(e, &stats, &s));
  expect_job(s, stats);
  EXPECT_EQ(s.at("evictions") + s.at("restores"), s.at("transfers_with_site"));
  // The probe allocates from its own code: that is the site named.
  EXPECT_NE(std::string::npos, read_file(trace_).find("\"site\":\"trace_probe"));
}

TEST_F(ChromeTraceRun, WithoutCuptiTransfersAreOnTheHostClock) {
  auto e = env();
  e.push_back("SPILLWAY_CUPTI=off");
  std::string stats;
  Summary s;
  ASSERT_NO_FATAL_FAILURE(run_job(e, &stats, &s));
  EXPECT_EQ(1, s.at("closed"));
  EXPECT_EQ(0, s.at("kernels"));
  // Real host time, not the simulator's clock.
  EXPECT_EQ(0, s.at("simulated"));
  EXPECT_GT(s.at("evictions"), 0);
  EXPECT_EQ(json_number(stats, "bytes_evicted"), s.at("bytes_evicted"));
  EXPECT_EQ(json_number(stats, "bytes_restored"), s.at("bytes_restored"));
  EXPECT_EQ(0, s.at("transfers_device_clock"));
  EXPECT_LE(s.at("max_resident_minus_budget"), 0);
}

TEST_F(ChromeTraceRun, SigtermWritesAndClosesTheTraceThenTerminates) {
  Child c(probe("hold"), env());
  const std::string stats = stats_line(c);
  ASSERT_EQ("ready", c.line());
  c.signal(SIGTERM);
  const int st = c.wait();
  // The previous disposition (the default) still ends the process.
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM) << st;
  const Summary s = check(trace_, false);
  ASSERT_EQ(0u, s.count("error"));
  EXPECT_EQ(1, s.at("closed"));
  EXPECT_EQ(1, s.at("has_end"));
  expect_job(s, stats);
}

TEST_F(ChromeTraceRun, SigintRunsTheJobsOwnHandlerAfterTheFlush) {
  Child c(probe("hold_int"), env());
  const std::string stats = stats_line(c);
  ASSERT_EQ("ready", c.line());
  c.signal(SIGINT);
  EXPECT_EQ("interrupted", c.line());
  const int st = c.wait();
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  const Summary s = check(trace_, false);
  ASSERT_EQ(0u, s.count("error"));
  EXPECT_EQ(1, s.at("closed"));
  expect_job(s, stats);
}

TEST_F(ChromeTraceRun, SigkillLeavesATraceThatLoadsUpToItsLastWrite) {
  Child c(probe("hold"), env());
  const std::string stats = stats_line(c);
  ASSERT_EQ("ready", c.line());
  // The writer flushes on its own: wait until all of the job is on disk (a
  // read racing a write may see a torn line: the next poll reads it whole).
  // Waiting for less once let the kill land before the memcpy's activity
  // record was written (a slow ThreadSanitizer run).
  Summary s;
  for (int i = 0; i < 400; ++i) {
    s = check(trace_, true, /*quiet=*/true);
    if (job_mismatches(s, stats).empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  c.signal(SIGKILL);
  const int st = c.wait();
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << st;
  // Not closed: the strict parser refuses it, the tolerant rule (a missing
  // final ']') loads all of it.
  EXPECT_EQ(1, check(trace_, false).count("error"));
  s = check(trace_, true);
  ASSERT_EQ(0u, s.count("error"));
  EXPECT_EQ(0, s.at("closed"));
  EXPECT_EQ(0, s.at("has_end"));
  expect_job(s, stats);
}

TEST_F(ChromeTraceRun, LongRunKeepsEveryBufferWithinItsCap) {
  constexpr long kLaunches = 100000;
  auto e = env("1GiB");
  // LeakSanitizer's exit scan crashes ("Tracer caught signal 11", a bogus
  // DTLS range) once a simulator stream worker has touched the thread_local
  // of the dlopen'ed libcupti.so.13, which it does when it hands over a full
  // activity buffer: a sanitizer runtime limitation with dynamic TLS on this
  // glibc, not a leak. This child runs without the leak check (ASan stays on).
  if (const char* a = std::getenv("ASAN_OPTIONS"))
    e.push_back(std::string("ASAN_OPTIONS=") + a + ":detect_leaks=0");
  Child c(probe("long", std::to_string(kLaunches)), e);
  stats_line(c);
  const int st = c.wait();
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  const Summary s = check(trace_, false);
  ASSERT_EQ(0u, s.count("error"));
  EXPECT_EQ(kLaunches, s.at("kernels"));
  EXPECT_EQ(kLaunches, s.at("kernels_device_clock"));
  EXPECT_EQ(0, s.at("end_records_dropped"));
  EXPECT_EQ(0, s.at("end_events_dropped"));
  EXPECT_LE(s.at("end_ring_peak"), s.at("end_ring_cap"));
  EXPECT_LE(s.at("end_out_peak_bytes"), s.at("end_out_cap_bytes"));
  EXPECT_LE(s.at("end_join_peak"), s.at("end_join_cap"));
  EXPECT_LE(s.at("end_activity_buffers_peak"), s.at("end_activity_buffers"));
  // Written out incrementally: the file is many times the buffer.
  EXPECT_GT(static_cast<long long>(fs::file_size(trace_)), 20 * s.at("end_out_cap_bytes"));
}

// In-process, no GPU: many threads of allocator events through tiny caps.
TEST(ChromeTraceWriter, MemoryStaysWithinTheCapsUnderLoad) {
  char tmpl[] = "/tmp/chrome_trace_XXXXXX";
  ASSERT_NE(nullptr, mkdtemp(tmpl));
  const std::string path = std::string(tmpl) + "/t.json";
  spillway::ChromeTrace::Limits lim;
  lim.ring_events = 16;
  lim.out_bytes = 8192;
  lim.join_slots = 4;
  lim.flush_ms = 2;
  std::string why;
  auto t = spillway::ChromeTrace::open(path, nullptr, &why, lim);
  ASSERT_NE(nullptr, t) << why;
  constexpr int kThreads = 4, kEach = 5000;
  std::vector<std::thread> th;
  for (int i = 0; i < kThreads; ++i)
    th.emplace_back([&, i] {
      for (int k = 0; k < kEach; ++k) {
        spillway::Transfer x;
        x.to_host = (k % 2) == 0;
        x.cause = x.to_host ? spillway::Cause::kBudget : spillway::Cause::kOnDemand;
        x.ptr = 0x7f0000000000ull + (static_cast<uint64_t>(i) << 32) + k * 4096ull;
        x.bytes = 4096;
        x.queued_ns = spillway::monotonic_ns();
        x.done_ns = x.queued_ns + 1000;
        t->on_transfer(x);
        t->on_memory(0, static_cast<uint64_t>(k) * 4096, 4096, 1ull << 30);
      }
    });
  for (auto& x : th) x.join();
  t->finish();
  const auto c = t->counters();
  EXPECT_TRUE(c.closed);
  EXPECT_EQ(0u, c.events_dropped);
  EXPECT_EQ(uint64_t{kThreads} * kEach, c.evictions + c.restores);
  EXPECT_EQ(c.evictions + c.restores, c.transfers_host_clock);
  EXPECT_LE(c.ring_peak, lim.ring_events);
  EXPECT_LE(c.out_peak, lim.out_bytes);
  EXPECT_GT(c.bytes_written, 20 * lim.out_bytes);
  const Summary s = check(path, false);
  ASSERT_EQ(0u, s.count("error"));
  EXPECT_EQ(static_cast<long long>(kThreads) * kEach * 4096,
            s.at("bytes_evicted") + s.at("bytes_restored"));
  // Events after the close are counted, not written.
  t->on_oom_avoided(0, 1, 2);
  EXPECT_EQ(1u, t->counters().events_late);
  fs::remove_all(tmpl);
}

// A block's move is one copy per 64 MiB host piece (and per live range of
// a split block), each with its own correlation id and source address: the
// trace shows one transfer on the device clock, from the first copy's start
// to the last one's end, whether the records come before or after the
// transfer, and none of its copies as "not committed" (they all were; a
// 500 MiB eviction once showed one piece's duration and seven uncommitted
// copies). A copy no transfer takes is still shown as not committed.
TEST(ChromeTraceWriter, ABlockMovedInSeveralCopiesIsOneTransfer) {
  char tmpl[] = "/tmp/chrome_trace_XXXXXX";
  ASSERT_NE(nullptr, mkdtemp(tmpl));
  const std::string path = std::string(tmpl) + "/t.json";
  std::string why;
  auto t = spillway::ChromeTrace::open(path, nullptr, &why);
  ASSERT_NE(nullptr, t) << why;
  constexpr uint64_t kPiece = 64ull << 20, P = 0x7f0000000000ull, R = 0x7f1000000000ull,
                     Q = 0x7f2000000000ull;
  auto* stream = reinterpret_cast<CUstream>(0x10);
  auto copy = [&](uint64_t src, uint32_t corr) {
    spillway::OwnCopy c;
    c.src = src;
    c.bytes = kPiece;
    c.stream = stream;
    c.correlation = corr;
    t->on_own_copy(c);
  };
  auto record = [](uint32_t corr, uint64_t start) {
    spillway::cupti::DeviceRecord r;
    r.kind = spillway::cupti::DeviceRecord::Kind::kMemcpy;
    r.correlation = corr;
    r.start = start;
    r.end = start + 1'000'000;  // 1 ms each
    r.bytes = kPiece;
    return r;
  };
  auto transfer = [&](uint64_t ptr) {
    spillway::Transfer x;
    x.ptr = ptr;
    x.bytes = 3 * kPiece;
    x.span = 3 * kPiece;
    x.stream = stream;
    t->on_transfer(x);
  };
  const uint64_t t0 = spillway::monotonic_ns();
  // Block P: three copies, the transfer, then the records in two batches.
  copy(P, 11);
  copy(P + kPiece, 12);
  copy(P + 2 * kPiece, 13);
  copy(Q, 20);  // another block's copy, never committed
  transfer(P);
  std::vector<spillway::cupti::DeviceRecord> first = {record(11, t0), record(12, t0 + 1'000'000)};
  t->on_records(first);
  std::vector<spillway::cupti::DeviceRecord> second = {record(13, t0 + 2'000'000),
                                                       record(20, t0 + 3'000'000)};
  t->on_records(second);
  // Block R: the records first, then the transfer.
  copy(R, 31);
  copy(R + kPiece, 32);
  copy(R + 2 * kPiece, 33);
  std::vector<spillway::cupti::DeviceRecord> third = {
      record(31, t0 + 4'000'000), record(32, t0 + 5'000'000), record(33, t0 + 6'000'000)};
  t->on_records(third);
  transfer(R);
  t->finish();
  const auto c = t->counters();
  EXPECT_EQ(2u, c.evictions);
  EXPECT_EQ(2u, c.transfers_device_clock);
  EXPECT_EQ(0u, c.transfers_host_clock);
  EXPECT_EQ(1u, c.uncommitted_copies);
  EXPECT_EQ(6 * kPiece, c.bytes_evicted);
  const std::string text = read_file(path);
  size_t evicts = 0;
  for (size_t at = text.find("\"evict (budget)\""); at != std::string::npos;
       at = text.find("\"evict (budget)\"", at + 1)) {
    ++evicts;
    const std::string line = text.substr(at, text.find('\n', at) - at);
    EXPECT_NE(line.find("\"dur\":3000.000"), std::string::npos) << line;  // three copies, in us
    EXPECT_NE(line.find("\"clock\":\"device\""), std::string::npos) << line;
  }
  EXPECT_EQ(2u, evicts) << text;
  EXPECT_NE(text.find("\"correlation\":20}"), std::string::npos) << text;  // the uncommitted one
  fs::remove_all(tmpl);
}

// The allocator calls the trace's observer methods with its lock held: they
// must return at once even when the writer cannot write. The file is a FIFO
// nobody reads, so the writer thread stalls in write(2) with the ring and the
// spill full: events are dropped and counted, and no producer waits (the
// ring's producers once waited up to 100 ms each for room).
TEST(ChromeTraceWriter, ProducersNeverWaitForAStalledWriter) {
  char tmpl[] = "/tmp/chrome_trace_XXXXXX";
  ASSERT_NE(nullptr, mkdtemp(tmpl));
  const std::string path = std::string(tmpl) + "/t.json";
  ASSERT_EQ(0, mkfifo(path.c_str(), 0600));
  const int reader = ::open(path.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  spillway::ChromeTrace::Limits lim;
  lim.ring_events = 16;
  lim.spill_events = 64;
  lim.out_bytes = 8192;
  lim.flush_ms = 1;
  std::string why;
  auto t = spillway::ChromeTrace::open(path, nullptr, &why, lim);
  ASSERT_NE(nullptr, t) << why;
  // Far more than the pipe (64 KiB), the out buffer, the ring and the spill hold.
  constexpr int kEvents = 20000;
  const auto start = std::chrono::steady_clock::now();
  auto slowest = std::chrono::steady_clock::duration::zero();
  int pushed = 0;
  for (; pushed < kEvents; ++pushed) {
    const auto before = std::chrono::steady_clock::now();
    spillway::Transfer x;
    x.ptr = 0x7f0000000000ull + pushed * 4096ull;
    x.bytes = 4096;
    t->on_transfer(x);
    const auto took = std::chrono::steady_clock::now() - before;
    slowest = std::max(slowest, took);
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(5)) break;
  }
  EXPECT_EQ(kEvents, pushed) << "the producers waited for the writer";
  EXPECT_LT(slowest, std::chrono::milliseconds(50));
  const auto c = t->counters();
  EXPECT_GT(c.events_dropped, 0u);
  EXPECT_LE(c.ring_peak, lim.ring_events);
  EXPECT_LE(c.spill_peak, lim.spill_events);
  // Unstall the writer, then close: the end event reports the drops. The
  // reading end is opened here, before finish(): opened by the thread after
  // a finish() that had already closed the writing end (a writer that was
  // not stalled, a slow run), open(2) of the FIFO would wait for a writer
  // forever.
  std::string data;
  const int fd = ::open(path.c_str(), O_RDONLY);  // the writer has it open: no wait
  EXPECT_GE(fd, 0);
  std::thread drain([&] {
    char buf[65536];  // blocking reads, until the writer closes
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;)
      data.append(buf, static_cast<size_t>(n));
    ::close(fd);
  });
  t->finish();
  drain.join();
  ::close(reader);
  const auto after = t->counters();
  EXPECT_TRUE(after.closed);
  EXPECT_EQ(uint64_t{kEvents}, after.evictions + after.events_dropped);
  EXPECT_NE(std::string::npos,
            data.find("\"events_dropped\":" + std::to_string(after.events_dropped)));
  EXPECT_EQ(0u, data.rfind("[", 0));
  EXPECT_GE(data.size(), 2u);
  EXPECT_EQ("]\n", data.substr(data.size() - 2));
  fs::remove_all(tmpl);
}

}  // namespace
