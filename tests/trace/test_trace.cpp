// trace::Writer and trace::Reader against docs/record-format.md: round trips of
// every record type, block framing, and every refusal the doc's "What a
// reader checks" lists, each at the byte offset where the problem is.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "trace/trace.h"

namespace {

namespace fs = std::filesystem;
using namespace spillway::trace;

const std::string kMeta = R"({"source":"test","model":"unit"})";
constexpr uint64_t kHeader = 8 + 4 + 4 + 4;  // + meta

class TraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("spwt_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static std::string slurp(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // A failed write fails the test here, by name: a file cut short by the
  // disk would otherwise read as the reader's fault (one unexplained
  // Damage.BlockLengthAndCount failure, session 23).
  static void spit(const std::string& p, const std::string& bytes) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    ASSERT_TRUE(out.good()) << "writing " << bytes.size() << " bytes to " << p << " failed";
    ASSERT_EQ(bytes.size(), fs::file_size(p)) << p;
  }

  // Reads the whole file; returns the events, and the error if any.
  struct Result {
    bool ok = false;
    std::vector<Event> events;
    ReadError error;
  };
  static Result read_all(const std::string& p) {
    Result r;
    Reader rd;
    if (!rd.open(p)) {
      r.error = rd.error();
      return r;
    }
    EXPECT_EQ(rd.meta(), kMeta);
    Event e;
    for (;;) {
      auto s = rd.next(e);
      if (s == Reader::Status::kEvent) {
        r.events.push_back(e);
        continue;
      }
      if (s == Reader::Status::kEnd) {
        r.ok = true;
      } else {
        r.error = rd.error();
      }
      return r;
    }
  }
  // Expects the file to be refused at `offset`, with `words` in the message.
  static void expect_refused(const std::string& p, uint64_t offset, const std::string& words) {
    Result r = read_all(p);
    ASSERT_FALSE(r.ok) << "accepted";
    EXPECT_EQ(r.error.offset, offset) << r.error.to_string();
    EXPECT_NE(r.error.message.find(words), std::string::npos) << r.error.to_string();
  }

  fs::path dir_;
};

// ---- Raw files, built byte by byte (independently of Writer) -------------

void u8(std::string& s, uint8_t v) {
  s.push_back(static_cast<char>(v));
}
void u32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}
void u64(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}
void vi(std::string& s, uint64_t v) {
  put_varint(s, v);
}

std::string header(const std::string& meta = kMeta, uint32_t version = kVersion) {
  std::string s = "SPWTRACE";
  u32(s, version);
  u32(s, static_cast<uint32_t>(meta.size()));
  s += meta;
  u32(s, crc32(meta.data(), meta.size()));
  return s;
}
std::string block(const std::string& payload, uint32_t count) {
  std::string s = "BLK1";
  u32(s, static_cast<uint32_t>(payload.size()));
  u32(s, count);
  u32(s, crc32(payload.data(), payload.size()));
  return s + payload;
}
std::string end(uint64_t records) {
  std::string s = "END1", n;
  u64(n, records);
  s += n;
  u32(s, crc32(n.data(), n.size()));
  return s;
}

// Record encoders.
std::string r_string(uint64_t id, const std::string& t) {
  std::string s;
  u8(s, 1);
  vi(s, id);
  vi(s, t.size());
  return s + t;
}
std::string r_alloc(uint64_t id, uint64_t size, uint64_t site = 0) {
  std::string s;
  u8(s, 2);
  vi(s, id);
  vi(s, size);
  vi(s, 0);
  vi(s, site);
  return s;
}
std::string r_free(uint64_t id) {
  std::string s;
  u8(s, 3);
  vi(s, id);
  vi(s, 0);
  return s;
}
std::string r_launch(uint64_t name, std::vector<TouchRec> touches) {
  std::string s;
  u8(s, 4);
  vi(s, 0);
  vi(s, name);
  vi(s, 1000);
  vi(s, touches.size());
  for (auto& t : touches) {
    vi(s, t.alloc);
    vi(s, t.offset);
    vi(s, t.length);
    u8(s, t.mode);
  }
  return s;
}
std::string r_copy(uint8_t kind, uint64_t bytes, Ref dst, Ref src) {
  std::string s;
  u8(s, 5);
  vi(s, 0);
  u8(s, kind);
  vi(s, bytes);
  vi(s, 10);
  vi(s, dst.alloc);
  vi(s, dst.offset);
  vi(s, src.alloc);
  vi(s, src.offset);
  return s;
}
std::string r_duration(uint64_t launch, uint64_t ns) {
  std::string s;
  u8(s, 8);
  vi(s, launch);
  vi(s, ns);
  return s;
}
std::string r_move(uint8_t type, uint64_t alloc, uint8_t cause) {
  std::string s;
  u8(s, type);
  vi(s, alloc);
  u8(s, cause);
  return s;
}

// A file of one block made of `records`, plus the offset of each record.
struct Built {
  std::string bytes;
  std::vector<uint64_t> at;  // file offset of each record
};
Built one_block(const std::vector<std::string>& records, bool with_end = true,
                uint32_t version = kVersion) {
  Built b;
  std::string payload;
  const uint64_t payload_start = header().size() + 16;
  for (const auto& r : records) {
    b.at.push_back(payload_start + payload.size());
    payload += r;
  }
  b.bytes = header(kMeta, version) + block(payload, static_cast<uint32_t>(records.size()));
  if (with_end) b.bytes += end(records.size());
  return b;
}

// ---- Basics ----------------------------------------------------------------

TEST(TraceCrc, MatchesZlib) {
  EXPECT_EQ(crc32("", 0), 0u);
  EXPECT_EQ(crc32("123456789", 9), 0xCBF43926u);
  EXPECT_EQ(crc32("The quick brown fox jumps over the lazy dog", 43), 0x414FA339u);
  // Incremental use equals one pass.
  const std::string s = "incremental crc of an odd-length string!";
  EXPECT_EQ(crc32(s.data() + 5, s.size() - 5, crc32(s.data(), 5)), crc32(s.data(), s.size()));
}

TEST(TraceVarint, EncodingsAndZigzag) {
  std::string s;
  put_varint(s, 0);
  EXPECT_EQ(s, std::string(1, '\0'));
  s.clear();
  put_varint(s, 300);
  EXPECT_EQ(s, "\xAC\x02");
  s.clear();
  put_varint(s, UINT64_MAX);
  EXPECT_EQ(s.size(), 10u);
  EXPECT_EQ(static_cast<unsigned char>(s[9]), 1u);
  for (int64_t v : {int64_t{0}, int64_t{-1}, int64_t{1}, INT64_MIN, INT64_MAX}) {
    EXPECT_EQ(unzigzag(zigzag(v)), v);
  }
  EXPECT_EQ(zigzag(-1), 1u);
  EXPECT_EQ(zigzag(1), 2u);
}

std::vector<Event> every_type() {
  std::vector<Event> ev;
  ev.push_back(StringRec{1, "aten::mm"});
  ev.push_back(StringRec{2, "site \xC3\xA9"});
  ev.push_back(StringRec{3, ""});
  ev.push_back(AllocRec{1, 4096, 0, 2});
  ev.push_back(AllocRec{2, uint64_t{1} << 40, 3, 0});
  ev.push_back(StepRec{0});
  ev.push_back(PhaseRec{PhaseKind::kForward});
  ev.push_back(LaunchRec{0, 1, 12345, {{1, 0, 4096, kModeRead}, {2, 7, 100, kModeWrite}}});
  ev.push_back(LaunchRec{3, 0, 0, {}});
  ev.push_back(LaunchRec{1, 1, 5, {{2, (uint64_t{1} << 40) - 1, 1, kModeUnknown}}});
  ev.push_back(LaunchRec{1, 1, 5, {{2, 0, uint64_t{1} << 40, kModeReadWrite}}});
  ev.push_back(DurationRec{1, 999});
  ev.push_back(CopyRec{0, CopyKind::kHostToDevice, 64, 3, {1, 8}, {0, 0}});
  ev.push_back(CopyRec{2, CopyKind::kDeviceToHost, 64, 3, {0, 0}, {1, 0}});
  ev.push_back(CopyRec{0, CopyKind::kDeviceToDevice, 4096, 3, {2, 0}, {1, 0}});
  ev.push_back(CopyRec{0, CopyKind::kMemset, 4096, 0, {1, 0}, {0, 0}});
  ev.push_back(PhaseRec{PhaseKind::kBackward});
  ev.push_back(PhaseRec{PhaseKind::kOptimizer});
  ev.push_back(PhaseRec{PhaseKind::kOther});
  ev.push_back(EvictRec{1, MoveCause::kBudget});
  ev.push_back(RestoreRec{1, MoveCause::kOnDemand});
  ev.push_back(EvictRec{1, MoveCause::kPressure});
  ev.push_back(EvictRec{2, MoveCause::kBudget});
  ev.push_back(RestoreRec{2, MoveCause::kPrefetch});
  ev.push_back(FreeRec{1, 0});  // freed while evicted
  ev.push_back(StepRec{UINT64_MAX});
  ev.push_back(FreeRec{2, 5});
  return ev;
}

TEST_F(TraceTest, RoundTripEveryRecordType) {
  const auto ev = every_type();
  {
    Writer w;
    ASSERT_TRUE(w.open(path("a.spwt"), kMeta)) << w.error();
    for (const auto& e : ev) ASSERT_TRUE(w.write(e)) << w.error();
    EXPECT_EQ(w.records(), ev.size());
    EXPECT_EQ(w.launches(), 4u);
    ASSERT_TRUE(w.close()) << w.error();
    EXPECT_TRUE(w.close());   // idempotent
    EXPECT_FALSE(w.step(1));  // closed
  }
  Result r = read_all(path("a.spwt"));
  ASSERT_TRUE(r.ok) << r.error.to_string();
  ASSERT_EQ(r.events.size(), ev.size());
  for (size_t i = 0; i < ev.size(); ++i) EXPECT_TRUE(r.events[i] == ev[i]) << "record " << i;
  // The writer's bytes are those of the independent raw builder.
  std::string payload;
  payload += r_string(1, "aten::mm");
  EXPECT_EQ(slurp(path("a.spwt")).substr(0, header().size()), header());
  EXPECT_EQ(slurp(path("a.spwt")).substr(header().size() + 16, payload.size()), payload);
}

TEST_F(TraceTest, ReaderExposesStringsAndLiveSizes) {
  Writer w;
  ASSERT_TRUE(w.open(path("s.spwt"), kMeta));
  w.string(1, "gemm");
  w.alloc(1, 512, 0, 1);
  ASSERT_TRUE(w.close());
  Reader rd;
  ASSERT_TRUE(rd.open(path("s.spwt")));
  Event e;
  ASSERT_EQ(rd.next(e), Reader::Status::kEvent);
  ASSERT_EQ(rd.next(e), Reader::Status::kEvent);
  ASSERT_NE(rd.string(1), nullptr);
  EXPECT_EQ(*rd.string(1), "gemm");
  EXPECT_EQ(rd.string(2), nullptr);
  EXPECT_EQ(rd.live_size(1), 512u);
  EXPECT_EQ(rd.record_offset(), header().size() + 16 + r_string(1, "gemm").size());
  EXPECT_EQ(rd.next(e), Reader::Status::kEnd);
  EXPECT_EQ(rd.next(e), Reader::Status::kEnd);
}

TEST_F(TraceTest, EmptyTraceHasNoBlocks) {
  Writer w;
  ASSERT_TRUE(w.open(path("e.spwt"), kMeta));
  ASSERT_TRUE(w.flush());  // nothing buffered: no empty block
  ASSERT_TRUE(w.close());
  EXPECT_EQ(slurp(path("e.spwt")), header() + end(0));
  EXPECT_TRUE(read_all(path("e.spwt")).ok);
}

TEST_F(TraceTest, BlocksAreAtMostOneMiBAndRecordsNeverSpanThem) {
  constexpr int kLaunches = 150000;
  Writer w;
  ASSERT_TRUE(w.open(path("big.spwt"), kMeta));
  ASSERT_TRUE(w.string(1, "k"));
  ASSERT_TRUE(w.alloc(1, 1 << 20, 0, 0));
  std::vector<TouchRec> t{{1, 0, 1 << 19, kModeRead}, {1, 1 << 19, 1 << 19, kModeWrite}};
  for (int i = 0; i < kLaunches; ++i) ASSERT_TRUE(w.launch(0, 1, 1000 + i, t));
  ASSERT_TRUE(w.close());
  const std::string bytes = slurp(path("big.spwt"));
  // Walk the framing: every block within bounds, at least 2 blocks.
  size_t pos = header().size(), blocks = 0;
  while (bytes.compare(pos, 4, "BLK1") == 0) {
    uint32_t len;
    std::memcpy(&len, bytes.data() + pos + 4, 4);
    EXPECT_GE(len, 1u);
    EXPECT_LE(len, kMaxBlockPayload);
    pos += 16 + len;
    ++blocks;
  }
  EXPECT_GE(blocks, 2u);
  EXPECT_EQ(bytes.compare(pos, 4, "END1"), 0);
  Result r = read_all(path("big.spwt"));
  ASSERT_TRUE(r.ok) << r.error.to_string();
  ASSERT_EQ(r.events.size(), kLaunches + 2u);
  EXPECT_EQ(std::get<LaunchRec>(r.events.back()).duration_ns, 1000u + kLaunches - 1);
}

TEST_F(TraceTest, FlushMakesABlockAndAnUnclosedFileReadsAsTruncated) {
  Writer w;
  ASSERT_TRUE(w.open(path("f.spwt"), kMeta));
  ASSERT_TRUE(w.step(0));
  ASSERT_TRUE(w.flush());
  const uint64_t size = fs::file_size(path("f.spwt"));
  EXPECT_EQ(size, header().size() + 16 + 2);
  Result r = read_all(path("f.spwt"));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.events.size(), 1u);  // the complete block was read
  EXPECT_EQ(r.error.offset, size);
  EXPECT_NE(r.error.message.find("end marker is missing"), std::string::npos);
  ASSERT_TRUE(w.step(1));
  ASSERT_TRUE(w.close());
  r = read_all(path("f.spwt"));
  ASSERT_TRUE(r.ok) << r.error.to_string();
  EXPECT_EQ(r.events.size(), 2u);
}

TEST_F(TraceTest, WriterRefusesWhatTheFormatCannotHold) {
  Writer w;
  EXPECT_FALSE(w.step(0));  // not open
  EXPECT_FALSE(w.open(path("no/such/dir/x.spwt"), kMeta));
  EXPECT_NE(w.error().find("cannot create"), std::string::npos);
  Writer w2;
  EXPECT_FALSE(w2.open(path("m.spwt"), std::string(kMaxMeta + 1, ' ')));
  Writer w3;
  ASSERT_TRUE(w3.open(path("w.spwt"), kMeta));
  EXPECT_FALSE(w3.string(1, std::string(kMaxBlockPayload, 'x')));
  EXPECT_NE(w3.error().find("does not fit"), std::string::npos);
  EXPECT_FALSE(w3.copy(0, static_cast<CopyKind>(7), 1, 1, {}, {}));
  EXPECT_FALSE(w3.phase(static_cast<PhaseKind>(4)));
  TouchRec bad{1, 0, 1, 4};
  EXPECT_FALSE(w3.launch(0, 0, 0, {&bad, 1}));
  EXPECT_EQ(w3.records(), 0u);
  ASSERT_TRUE(w3.close());
  EXPECT_TRUE(read_all(path("w.spwt")).ok);
}

// ---- Framing damage ----------------------------------------------------------

class Damage : public TraceTest {
 protected:
  void SetUp() override {
    TraceTest::SetUp();
    Writer w;
    ASSERT_TRUE(w.open(path("good.spwt"), kMeta));
    for (const auto& e : every_type()) ASSERT_TRUE(w.write(e));
    ASSERT_TRUE(w.flush());  // two blocks
    ASSERT_TRUE(w.step(7));
    ASSERT_TRUE(w.close());
    good_ = slurp(path("good.spwt"));
    block0_ = header().size();
    uint32_t len;
    std::memcpy(&len, good_.data() + block0_ + 4, 4);
    block1_ = block0_ + 16 + len;
    end_ = good_.size() - 16;
    ASSERT_EQ(good_.compare(block1_, 4, "BLK1"), 0);
    ASSERT_EQ(good_.compare(end_, 4, "END1"), 0);
    ASSERT_TRUE(read_all(path("good.spwt")).ok);
  }
  std::string bad_file(const std::string& bytes) {
    spit(path("bad.spwt"), bytes);
    return path("bad.spwt");
  }
  std::string flipped(uint64_t at, unsigned char mask = 0x40) {
    std::string b = good_;
    b[at] = static_cast<char>(b[at] ^ mask);
    return bad_file(b);
  }
  std::string good_;
  uint64_t block0_ = 0, block1_ = 0, end_ = 0;
};

TEST_F(Damage, HeaderFields) {
  expect_refused(flipped(0), 0, "bad magic");
  expect_refused(flipped(8, 0x02), 8, "unsupported version");
  std::string b = good_;
  b[12] = 0;
  b[13] = 0;
  b[14] = 0x20;  // meta_len = 2 MiB
  expect_refused(bad_file(b), 12, "larger than 1 MiB");
  expect_refused(flipped(16 + 3), 16, "meta CRC");
  expect_refused(flipped(16 + kMeta.size()), 16, "meta CRC");  // the stored CRC
}

TEST_F(Damage, BlockPayloadAndCrc) {
  expect_refused(flipped(block0_ + 16 + 5), block0_, "block CRC mismatch");
  expect_refused(flipped(block0_ + 12), block0_, "block CRC mismatch");  // the CRC itself
  expect_refused(flipped(block1_ + 16), block1_, "block CRC mismatch");
  expect_refused(flipped(block0_ + 1), block0_, "expected a block");
}

TEST_F(Damage, BlockLengthAndCount) {
  std::string b = good_;
  std::memset(b.data() + block0_ + 4, 0, 4);
  expect_refused(bad_file(b), block0_ + 4, "block length 0");
  b = good_;
  b[block0_ + 4 + 2] = 0x20;  // > 1 MiB
  expect_refused(bad_file(b), block0_ + 4, "is not 1 .. 1 MiB");
  b = good_;
  std::memset(b.data() + block0_ + 8, 0, 4);
  expect_refused(bad_file(b), block0_ + 8, "record count is 0");
}

TEST_F(Damage, TruncatedAnywhere) {
  // Every cut is refused, at the length of the cut file.
  for (size_t cut = 0; cut < good_.size(); ++cut) {
    spit(path("cut.spwt"), good_.substr(0, cut));
    Result r = read_all(path("cut.spwt"));
    ASSERT_FALSE(r.ok) << "cut at " << cut << " accepted";
    EXPECT_EQ(r.error.offset, cut) << r.error.to_string();
    EXPECT_NE(r.error.message.find("truncated"), std::string::npos) << r.error.to_string();
  }
}

TEST_F(Damage, EndMarker) {
  expect_refused(bad_file(good_ + "x"), good_.size(), "1 bytes follow the end marker");
  expect_refused(bad_file(good_ + good_), good_.size(), "follow the end marker");
  expect_refused(flipped(end_ + 4), end_, "end marker CRC");
  expect_refused(flipped(end_ + 13), end_, "end marker CRC");
  // A wrong count with a matching CRC.
  std::string b = good_.substr(0, end_) + end(3);
  expect_refused(bad_file(b), end_ + 4, "end marker counts 3 records");
}

// ---- Records -------------------------------------------------------------------

TEST_F(TraceTest, BlockCountMustMatchItsRecords) {
  const std::string p = r_alloc(1, 64) + r_free(1);
  const uint64_t blk = header().size();
  spit(path("x.spwt"), header() + block(p, 3) + end(2));
  expect_refused(path("x.spwt"), blk + 8, "counts 3 records, its payload holds 2");
  spit(path("x.spwt"), header() + block(p, 1) + end(1));
  expect_refused(path("x.spwt"), blk + 8, "end 3 bytes before its payload");
}

TEST_F(TraceTest, UnknownRecordType) {
  std::string bad(1, '\x0b');
  Built b = one_block({r_alloc(1, 64), bad + std::string(1, '\0')});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[1], "unknown record type 11");
  b = one_block({std::string(1, '\0')});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[0], "unknown record type 0");
}

TEST_F(TraceTest, VarintsMustEndInTheirBlockWithinTenBytes) {
  std::string run_off = "\x06\x80";  // STEP whose varint never ends
  Built b = one_block({r_alloc(1, 8), run_off});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[1] + 1, "varint runs past the end of its block");
  std::string eleven = std::string(1, '\x06') + std::string(10, '\x80') + std::string(1, '\0');
  b = one_block({eleven});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[0] + 1, "longer than 10 bytes");
  std::string too_big = std::string(1, '\x06') + std::string(9, '\xFF') + "\x02";
  b = one_block({too_big});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[0] + 1, "does not fit in 64 bits");
  std::string max = std::string(1, '\x06') + std::string(9, '\xFF') + "\x01";
  b = one_block({max});
  spit(path("x.spwt"), b.bytes);
  EXPECT_TRUE(read_all(path("x.spwt")).ok);
  // A string's bytes, and a u8 field, running past the block.
  std::string s =
      "\x01\x01\x05"
      "ab";
  b = one_block({s});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[0] + 3, "string of 5 bytes runs past");
  b = one_block({std::string(1, '\x07')});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[0] + 1, "phase runs past");
  // A LAUNCH claiming more touches than its block can hold.
  std::string l("\x04\x00\x00\x00", 4);
  vi(l, 1000);
  b = one_block({l});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[0] + 4, "claims 1000 touches");
}

TEST_F(TraceTest, StringsDefinedOnceBeforeUse) {
  Built b = one_block({r_launch(3, {})});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[0], "LAUNCH name string 3 is used before it is defined");
  b = one_block({r_alloc(1, 8, 2), r_string(2, "late")});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[0], "ALLOC site string 2 is used before");
  b = one_block({r_string(1, "a"), r_string(1, "b")});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[1], "defined twice");
  b = one_block({r_string(0, "zero")});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[0], "id 0 is reserved");
}

TEST_F(TraceTest, AllocationIdsAreNeverReused) {
  Built b = one_block({r_alloc(1, 8), r_free(1), r_alloc(1, 8)});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[2], "ALLOC reuses id 1");
  // Out-of-order ids are fine as long as none repeats.
  b = one_block({r_alloc(5, 8), r_alloc(3, 8), r_alloc(4, 8), r_alloc(6, 8), r_alloc(1, 8),
                 r_free(4), r_alloc(4, 8)});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[6], "ALLOC reuses id 4");
  b = one_block({r_alloc(0, 8)});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[0], "ALLOC id 0");
}

TEST_F(TraceTest, FreeTouchAndRefNameLiveAllocations) {
  Built b = one_block({r_alloc(1, 8), r_free(2)});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[1], "FREE names allocation 2, which is not live");
  b = one_block({r_alloc(1, 8), r_free(1), r_free(1)});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[2], "FREE names allocation 1");
  b = one_block({r_alloc(1, 8), r_free(1), r_launch(0, {{1, 0, 8, 1}})});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[2], "touch 0 of a LAUNCH names allocation 1");
  b = one_block({r_alloc(1, 8), r_copy(1, 8, {2, 0}, {0, 0})});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[1], "COPY dst names allocation 2");
  b = one_block({r_alloc(1, 8), r_copy(2, 8, {0, 0}, {3, 0})});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[1], "COPY src names allocation 3");
}

TEST_F(TraceTest, RangesStayInsideTheirAllocation) {
  Built b = one_block({r_alloc(1, 100), r_launch(0, {{1, 0, 100, 1}, {1, 50, 51, 2}})});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[1], "touch 1 of a LAUNCH range [50, +51) falls outside");
  b = one_block({r_alloc(1, 100), r_launch(0, {{1, 101, 0, 1}})});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[1], "falls outside");
  b = one_block({r_alloc(1, 100), r_launch(0, {{1, UINT64_MAX, 2, 1}})});  // wraps
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[1], "falls outside");
  b = one_block({r_alloc(1, 100), r_copy(3, 60, {1, 50}, {1, 0})});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[1], "COPY dst range [50, +60)");
  b = one_block({r_alloc(1, 100), r_launch(0, {{1, 0, 100, 3}, {1, 100, 0, 0}})});
  spit(path("x.spwt"), b.bytes);
  EXPECT_TRUE(read_all(path("x.spwt")).ok);
}

TEST_F(TraceTest, FieldValuesOutsideTheirRange) {
  Built b = one_block({r_alloc(1, 8), r_launch(0, {{1, 0, 8, 4}})});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[1], "mode 4");
  b = one_block({r_alloc(1, 8), r_copy(5, 8, {1, 0}, {0, 0})});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[1], "COPY kind 5");
  b = one_block({r_alloc(1, 8), r_copy(4, 8, {1, 0}, {1, 0})});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[1], "memset COPY has a source");
  b = one_block({std::string("\x07\x04", 2)});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[0], "PHASE 4");
}

TEST_F(TraceTest, VersionOneReadsWithoutMovesAndRefusesThem) {
  Built b = one_block({r_alloc(1, 64), r_free(1)}, true, 1);
  spit(path("x.spwt"), b.bytes);
  Result r = read_all(path("x.spwt"));
  ASSERT_TRUE(r.ok) << r.error.to_string();
  EXPECT_EQ(r.events.size(), 2u);
  b = one_block({r_alloc(1, 64), r_move(9, 1, 0)}, true, 1);
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[1], "record type 9 is unknown in version 1");
  b = one_block({r_alloc(1, 64), r_move(10, 1, 0)}, true, 1);
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[1], "record type 10 is unknown in version 1");
  spit(path("x.spwt"), one_block({}, true, 3).bytes);
  expect_refused(path("x.spwt"), 8, "unsupported version 3 (this reader knows 1 to 2)");
}

TEST_F(TraceTest, MovesNameLiveAllocationsAndAlternate) {
  Built b = one_block({r_move(9, 1, 0)});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[0], "EVICT names allocation 1, which is not live");
  b = one_block({r_alloc(1, 64), r_move(10, 1, 3)});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[1], "RESTORE of allocation 1, which is not evicted");
  b = one_block({r_alloc(1, 64), r_move(9, 1, 0), r_move(9, 1, 1)});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[2], "EVICT of allocation 1, already evicted");
  b = one_block({r_alloc(1, 64), r_move(9, 1, 4)});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[1], "EVICT cause 4 is not 0-3");
  // Freed while evicted, then a RESTORE of it: not live.
  b = one_block({r_alloc(1, 64), r_move(9, 1, 0), r_free(1), r_move(10, 1, 3)});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[3], "RESTORE names allocation 1, which is not live");
  Writer w;
  ASSERT_TRUE(w.open(path("w.spwt"), kMeta));
  EXPECT_FALSE(w.evict(1, static_cast<MoveCause>(4)));
  EXPECT_NE(w.error().find("move cause 4 is not 0-3"), std::string::npos) << w.error();
}

TEST_F(TraceTest, DurationNamesAnEarlierLaunch) {
  Built b = one_block({r_string(1, "k"), r_launch(1, {}), r_duration(0, 5), r_duration(1, 5)});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[3], "DURATION names LAUNCH 1, but only 1 came before");
  b = one_block({r_duration(0, 5)});
  spit(path("x.spwt"), b.bytes);
  expect_refused(path("x.spwt"), b.at[0], "DURATION names LAUNCH 0");
}

TEST_F(TraceTest, MissingFileAndWrongKind) {
  Reader rd;
  EXPECT_FALSE(rd.open(path("absent.spwt")));
  EXPECT_NE(rd.error().message.find("cannot open"), std::string::npos);
  Reader rd2;
  EXPECT_FALSE(rd2.open(dir_.string()));
  Event e;
  EXPECT_EQ(rd2.next(e), Reader::Status::kError);
}

}  // namespace
