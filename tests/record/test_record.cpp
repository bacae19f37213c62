// SPILLWAY_RECORD: a job's record read back has the job's events, in order;
// a damaged record is refused with the offset of the damage; a record that
// cannot be written costs the job nothing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "recorder.h"
#include "trace/trace.h"

namespace fs = std::filesystem;
namespace tr = spillway::trace;

namespace {

constexpr uint64_t kBig = 4u << 20, kSmall = 4096;

// Runs the probe with SPILLWAY_RECORD=path; returns its exit status and output.
int run_probe(const std::string& record, std::string* out, const std::string& more_env = "") {
  const std::string cmd = "env -u LD_PRELOAD " + more_env + " SPILLWAY_RECORD='" + record +
                          "' SPILLWAY_CUPTI_PATH='" SIM_CUPTI "' SPILLWAY_LOG_LEVEL=info " +
                          RECORD_PROBE " '" SHIM_LIBRARY "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) *out += buf;
  int status = pclose(p);
  // The shell's convention, whether the shell or the probe died: 128 + the
  // signal that ended the probe.
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string temp_path(const char* name) {
  return (fs::temp_directory_path() / (std::string(name) + "-" + std::to_string(getpid())))
      .string();
}

std::vector<tr::Event> read_all(const std::string& path, std::string* error) {
  tr::Reader r;
  std::vector<tr::Event> events;
  if (!r.open(path)) {
    *error = r.error().to_string();
    return events;
  }
  tr::Event e;
  for (;;) {
    auto st = r.next(e);
    if (st == tr::Reader::Status::kEnd) break;
    if (st == tr::Reader::Status::kError) {
      *error = r.error().to_string();
      break;
    }
    events.push_back(e);
  }
  return events;
}

}  // namespace

class RecordRun : public ::testing::TestWithParam<bool> {};

// Without SPILLWAY_TRACE the recorder reads the activity records itself;
// with it, the Chrome trace does and hands them on.
TEST_P(RecordRun, TheJobsEventsReadBackInOrder) {
  const std::string path = temp_path("spillway-record.spwt");
  const std::string chrome = temp_path("spillway-record-chrome.json");
  std::string out;
  ASSERT_EQ(0, run_probe(path, &out, GetParam() ? "SPILLWAY_TRACE='" + chrome + "'" : "")) << out;
  EXPECT_NE(std::string::npos, out.find("SPILLWAY_RECORD")) << out;
  std::string error;
  auto ev = read_all(path, &error);
  ASSERT_EQ("", error);
  // Strings are interned as they first appear; kernel durations (DURATION
  // records, written as activity records arrive) are checked apart.
  std::vector<tr::Event> want = {
      tr::StepRec{0},
      tr::AllocRec{1, kBig, 0, 0},
      tr::AllocRec{2, kBig, 0, 0},
      tr::AllocRec{3, kSmall, 0, 0},
      tr::StringRec{1, "probe_kernel"},
      tr::LaunchRec{0, 1, 0, {{1, 0, kBig, 0}, {2, 0, kBig, 0}, {3, 0, kSmall, 0}}},
      tr::StringRec{2, "[memset]"},
      tr::LaunchRec{0, 2, 0, {{2, 4096, 64, 0}}},
      tr::StepRec{1},
      tr::FreeRec{1, 0},
      tr::LaunchRec{0, 1, 0, {{2, 0, kBig, 0}, {3, 0, kSmall, 0}}},
      tr::FreeRec{2, 0},
      tr::FreeRec{3, 0},
  };
  std::vector<tr::Event> got;
  std::vector<tr::DurationRec> durations;
  for (auto& e : ev) {
    if (auto* d = std::get_if<tr::DurationRec>(&e))
      durations.push_back(*d);
    else
      got.push_back(e);
  }
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_TRUE(want[i] == got[i])
        << "record " << i << " differs (type " << tr::name_of(tr::type_of(got[i])) << ")";
  // The two kernel launches (LAUNCH 0 and 2) get their device time from the
  // activity records: the simulated kernel's declared 7 us. A memset's
  // record is not a kernel's: LAUNCH 1 keeps duration 0 (unknown).
  ASSERT_EQ(2u, durations.size());
  EXPECT_EQ((tr::DurationRec{0, 7000}), durations[0]);
  EXPECT_EQ((tr::DurationRec{2, 7000}), durations[1]);
  fs::remove(path);
  fs::remove(chrome);
}

// Under a budget that holds one of the probe's two 4 MiB blocks, spillway
// moves them, and the record (version 2) says so: EVICT and RESTORE records
// among the job's own, each naming a live allocation, alternating (the
// reader checks both), with their causes; the job's events are unchanged.
// PyTorch's memory snapshot converter marks them.
TEST(Record, EvictionsAndRestoresAreInTheRecord) {
  const std::string path = temp_path("spillway-record-moves.spwt");
  std::string out;
  ASSERT_EQ(0, run_probe(path, &out, "SPILLWAY_GPU_BUDGET=6MiB")) << out;
  std::string error;
  auto ev = read_all(path, &error);
  ASSERT_EQ("", error);
  std::map<uint64_t, int> evicted, restored;
  size_t job_events = 0;
  for (const auto& e : ev) {
    if (auto* m = std::get_if<tr::EvictRec>(&e)) {
      ++evicted[m->alloc];
      EXPECT_TRUE(m->cause == tr::MoveCause::kBudget || m->cause == tr::MoveCause::kPressure)
          << tr::name_of(m->cause);
    } else if (auto* m = std::get_if<tr::RestoreRec>(&e)) {
      ++restored[m->alloc];
      EXPECT_TRUE(m->cause == tr::MoveCause::kOnDemand || m->cause == tr::MoveCause::kPrefetch)
          << tr::name_of(m->cause);
    } else if (!std::holds_alternative<tr::DurationRec>(e)) {
      ++job_events;
    }
  }
  EXPECT_EQ(13u, job_events) << out;  // as without a budget (TheJobsEventsReadBackInOrder)
  // Allocations 1 and 2 are the 4 MiB blocks: at least one left the device;
  // the small allocation 3 never moves.
  EXPECT_GE(evicted[1] + evicted[2], 1) << out;
  EXPECT_EQ(0, evicted[3]);
  // The first launch used both blocks: what left before it came back.
  EXPECT_GE(restored[1] + restored[2], 1) << out;
  const std::string snap = path + ".pickle";
  std::string conv;
  FILE* p = popen(("/usr/bin/python3 '" SOURCE_DIR "/harness/to_memory_snapshot.py' '" + path +
                   "' -o '" + snap + "' 2>&1")
                      .c_str(),
                  "r");
  ASSERT_NE(nullptr, p);
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) conv += buf;
  ASSERT_EQ(0, pclose(p)) << conv;
  const int moves = evicted[1] + evicted[2];
  EXPECT_NE(std::string::npos, conv.find(std::to_string(moves) + " evictions and ")) << conv;
  fs::remove(path);
  fs::remove(snap);
}

INSTANTIATE_TEST_SUITE_P(Record, RecordRun, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "WithChromeTrace" : "Alone"; });

TEST(Record, ATruncatedOrCorruptedRecordIsRefusedWithItsOffset) {
  const std::string path = temp_path("spillway-record-cut.spwt");
  std::string out;
  ASSERT_EQ(0, run_probe(path, &out)) << out;
  const auto size = fs::file_size(path);
  std::string bytes(size, '\0');
  {
    std::ifstream in(path, std::ios::binary);
    in.read(bytes.data(), static_cast<std::streamsize>(size));
  }
  // Cut short: the end marker is missing.
  {
    std::ofstream cut(path, std::ios::binary | std::ios::trunc);
    cut.write(bytes.data(), static_cast<std::streamsize>(size - 5));
  }
  std::string error;
  read_all(path, &error);
  EXPECT_NE(std::string::npos, error.find("offset")) << error;
  // One flipped byte inside the first block's payload (the STEP 0 record
  // the recorder opens with, alone in its block: the writer ends a block at
  // each step): its CRC fails.
  std::string flipped = bytes;
  const size_t header = 8 + 4 + 4 + static_cast<uint8_t>(bytes[12]) + 4;  // meta < 256 bytes
  flipped[header + 16 + 1] ^= 0x40;
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(flipped.data(), static_cast<std::streamsize>(flipped.size()));
  }
  error.clear();
  read_all(path, &error);
  EXPECT_NE(std::string::npos, error.find("offset " + std::to_string(header))) << error;
  EXPECT_NE(std::string::npos, error.find("CRC")) << error;
  fs::remove(path);
}

// Issue 15 item 4: a job killed by SIGTERM (a scheduler's preemption)
// leaves a complete record and statistics file; one killed by SIGKILL, a
// record that reads back up to the last step begun, and the reader says
// where it stopped.
std::vector<tr::Event> without_durations(const std::vector<tr::Event>& ev) {
  std::vector<tr::Event> out;
  for (const auto& e : ev)
    if (!std::holds_alternative<tr::DurationRec>(e)) out.push_back(e);
  return out;
}

TEST(Record, ASigtermLeavesACompleteRecordAndStatistics) {
  const std::string path = temp_path("spillway-record-term.spwt");
  const std::string stats = temp_path("spillway-record-term.json");
  std::string out;
  ASSERT_EQ(128 + SIGTERM,
            run_probe(path, &out, "RECORD_PROBE_END=term SPILLWAY_STATS='" + stats + "'"))
      << out;
  EXPECT_NE(std::string::npos, out.find("done")) << out;
  EXPECT_NE(std::string::npos, out.find("peak resident")) << out;  // the exit summary
  std::string error;
  const auto ev = without_durations(read_all(path, &error));
  EXPECT_EQ("", error);
  ASSERT_EQ(13u, ev.size());
  EXPECT_TRUE((ev.back() == tr::Event{tr::FreeRec{3, 0}}));
  std::ifstream f(stats);
  const std::string json((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(std::string::npos, json.find("\"mallocs\": 3")) << json;
  EXPECT_EQ("}\n", json.size() >= 2 ? json.substr(json.size() - 2) : json) << json;
  fs::remove(path);
  fs::remove(stats);
}

TEST(Record, ASigkillLeavesARecordThatReadsBackUpToTheLastStep) {
  const std::string path = temp_path("spillway-record-kill.spwt");
  std::string out;
  ASSERT_EQ(128 + SIGKILL, run_probe(path, &out, "RECORD_PROBE_END=kill")) << out;
  std::string error;
  const auto ev = without_durations(read_all(path, &error));
  // Steps 0 and 1 begun: everything up to the STEP 1 record; the frees and
  // the launch after it were in the block the kill cut off.
  ASSERT_EQ(9u, ev.size()) << error;
  EXPECT_TRUE((ev.back() == tr::Event{tr::StepRec{1}}));
  EXPECT_NE(std::string::npos, error.find("file is truncated: the end marker is missing")) << error;
  EXPECT_NE(std::string::npos, error.find("up to step 1 begun")) << error;
  fs::remove(path);
}

TEST(Record, AnUnwritableRecordWarnsAndTheJobRunsOn) {
  std::string out;
  ASSERT_EQ(0, run_probe("/nonexistent-dir/x/record.spwt", &out)) << out;
  EXPECT_NE(std::string::npos, out.find("cannot write SPILLWAY_RECORD")) << out;
  EXPECT_NE(std::string::npos, out.find("done")) << out;
}

// SPILLWAY_STACKS=1: each large allocation names its native call site (here
// the probe's main), in the record and, for evicted blocks, in the summary.
TEST(Record, StacksNameTheCallSiteOfLargeAllocations) {
  const std::string path = temp_path("spillway-record-stacks.spwt");
  std::string out;
  ASSERT_EQ(0, run_probe(path, &out, "SPILLWAY_STACKS=1 SPILLWAY_GPU_BUDGET=8MiB")) << out;
  EXPECT_NE(std::string::npos, out.find("allocation sites whose blocks were evicted most")) << out;
  EXPECT_NE(std::string::npos, out.find("bytes evicted in")) << out;
  std::string error;
  auto ev = read_all(path, &error);
  ASSERT_EQ("", error);
  std::map<uint64_t, std::string> strings;
  std::map<uint64_t, uint64_t> site_of;  // alloc -> site
  for (auto& e : ev) {
    if (auto* s = std::get_if<tr::StringRec>(&e)) strings[s->id] = s->text;
    if (auto* a = std::get_if<tr::AllocRec>(&e)) site_of[a->alloc] = a->site;
  }
  ASSERT_EQ(3u, site_of.size());
  for (uint64_t large : {1u, 2u}) {
    ASSERT_NE(0u, site_of[large]);
    EXPECT_NE(std::string::npos, strings[site_of[large]].find("record_probe"))
        << strings[site_of[large]];
  }
  EXPECT_NE(site_of[1], site_of[2]) << "two call sites, two sites";
  EXPECT_EQ(0u, site_of[3]) << "small blocks have no site";
  fs::remove(path);
}

// The recorder is called on the job's threads (allocations, launches, step
// marks), some of them holding locks: it must never write there. Its file is
// a FIFO nobody reads, so whatever writes stalls once the pipe is full: the
// calls must all return, the writer thread being the one that waits.
TEST(Record, TheCallersNeverWriteTheFile) {
  char tmpl[] = "/tmp/spillway-record-XXXXXX";
  ASSERT_NE(nullptr, mkdtemp(tmpl));
  const std::string path = std::string(tmpl) + "/r.spwt";
  ASSERT_EQ(0, mkfifo(path.c_str(), 0600));
  const int reader = ::open(path.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  std::string why;
  auto rec = spillway::Recorder::open(path, &why);
  ASSERT_NE(nullptr, rec) << why;
  // Several blocks of records (a block is written when 1 MiB is full), far
  // more than the pipe's 64 KiB.
  constexpr int kAllocs = 400000;
  std::atomic<int> done{0};
  std::thread job([&] {
    for (int i = 0; i < kAllocs; ++i) {
      const auto p = reinterpret_cast<const void*>(0x7f0000000000ull + i * 4096ull);
      rec->on_alloc({p, 4096, nullptr, 0, nullptr});
      rec->on_free({p, 4096, nullptr, 0, nullptr});
      done.fetch_add(1, std::memory_order_relaxed);
    }
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (done.load() < kAllocs && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(kAllocs, done.load()) << "a caller waited for the file";
  // Unstall (also what lets a failing run end), then read the record back.
  // The reading end is opened before close(): opened after a close() that
  // had already closed the writing end, open(2) of the FIFO would wait for a
  // writer forever.
  const std::string copy = path + ".copy";
  const int fd = ::open(path.c_str(), O_RDONLY);  // the writer has it open: no wait
  EXPECT_GE(fd, 0);
  std::thread drain([&] {
    const int out = ::open(copy.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    char buf[65536];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;)
      if (::write(out, buf, static_cast<size_t>(n)) != n) break;
    ::close(out);
    ::close(fd);
  });
  job.join();
  rec->close();
  drain.join();
  ::close(reader);
  std::string error;
  const auto ev = read_all(copy, &error);
  ASSERT_EQ("", error);
  // STEP 0, then every allocation and free, in order.
  ASSERT_EQ(1u + 2u * kAllocs, ev.size());
  EXPECT_TRUE(std::holds_alternative<tr::StepRec>(ev[0]));
  EXPECT_TRUE((tr::Event{tr::AllocRec{1, 4096, 0, 0}}) == ev[1]);
  EXPECT_TRUE((tr::Event{tr::FreeRec{kAllocs, 0}}) == ev.back());
  fs::remove_all(tmpl);
}
