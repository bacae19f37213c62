// The spillway trace format (.spwt, version 2): writer and reader.
// Specification: docs/record-format.md. Everything here lives in
// spillway::trace; the library is linked statically, with hidden visibility,
// into libspillway.so and spillway-replay.
//
// Errors are returned, never thrown: every member function is noexcept
// except where noted (std::bad_alloc from the standard containers is not
// caught and ends the process, as it would anywhere in the shim).
// Neither class is thread-safe: a caller that writes from several threads
// serializes the calls itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>

namespace spillway::trace {

// Written: version 2. Read: 1 (no EVICT or RESTORE) and 2.
inline constexpr uint32_t kVersion = 2;
inline constexpr uint32_t kOldestVersion = 1;
inline constexpr size_t kMaxBlockPayload = size_t{1} << 20;  // 1 MiB
inline constexpr size_t kMaxMeta = size_t{1} << 20;

enum class RecordType : uint8_t {
  kString = 1,
  kAlloc = 2,
  kFree = 3,
  kLaunch = 4,
  kCopy = 5,
  kStep = 6,
  kPhase = 7,
  kDuration = 8,
  kEvict = 9,     // version 2
  kRestore = 10,  // version 2
};

// TouchRec modes (bit 0 read, bit 1 write; 0 unknown).
inline constexpr uint8_t kModeUnknown = 0;
inline constexpr uint8_t kModeRead = 1;
inline constexpr uint8_t kModeWrite = 2;
inline constexpr uint8_t kModeReadWrite = 3;

enum class CopyKind : uint8_t {
  kHostToDevice = 1,
  kDeviceToHost = 2,
  kDeviceToDevice = 3,
  kMemset = 4
};
enum class PhaseKind : uint8_t { kOther = 0, kForward = 1, kBackward = 2, kOptimizer = 3 };
// Why spillway moved an allocation (EVICT, RESTORE): its Cause (events.h).
enum class MoveCause : uint8_t { kBudget = 0, kPressure = 1, kPrefetch = 2, kOnDemand = 3 };
const char* name_of(MoveCause c) noexcept;

struct TouchRec {
  uint64_t alloc = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint8_t mode = kModeUnknown;
  bool operator==(const TouchRec&) const = default;
};

struct StringRec {
  uint64_t id = 0;
  std::string text;
  bool operator==(const StringRec&) const = default;
};
struct AllocRec {
  uint64_t alloc = 0;
  uint64_t size = 0;
  uint64_t stream = 0;
  uint64_t site = 0;
  bool operator==(const AllocRec&) const = default;
};
struct FreeRec {
  uint64_t alloc = 0;
  uint64_t stream = 0;
  bool operator==(const FreeRec&) const = default;
};
struct LaunchRec {
  uint64_t stream = 0;
  uint64_t name = 0;
  uint64_t duration_ns = 0;
  std::vector<TouchRec> touches;
  bool operator==(const LaunchRec&) const = default;
};
struct Ref {
  uint64_t alloc = 0;  // 0: memory outside the traced allocations
  uint64_t offset = 0;
  bool operator==(const Ref&) const = default;
};
struct CopyRec {
  uint64_t stream = 0;
  CopyKind kind = CopyKind::kHostToDevice;
  uint64_t bytes = 0;
  uint64_t duration_ns = 0;
  Ref dst;
  Ref src;  // memset: {0, 0}
  bool operator==(const CopyRec&) const = default;
};
struct StepRec {
  uint64_t step = 0;
  bool operator==(const StepRec&) const = default;
};
struct PhaseRec {
  PhaseKind phase = PhaseKind::kOther;
  bool operator==(const PhaseRec&) const = default;
};
struct DurationRec {
  uint64_t launch = 0;  // index of the LAUNCH record in the file, from 0
  uint64_t duration_ns = 0;
  bool operator==(const DurationRec&) const = default;
};

// Version 2: spillway moved a live allocation's bytes to host memory
// (EVICT) or back to the device (RESTORE), in the recorded run. A replay
// makes its own moves; these say what the recorded run did.
struct EvictRec {
  uint64_t alloc = 0;
  MoveCause cause = MoveCause::kBudget;
  bool operator==(const EvictRec&) const = default;
};
struct RestoreRec {
  uint64_t alloc = 0;
  MoveCause cause = MoveCause::kOnDemand;
  bool operator==(const RestoreRec&) const = default;
};

// One record. The variant index + 1 is the record type byte.
using Event = std::variant<StringRec, AllocRec, FreeRec, LaunchRec, CopyRec, StepRec, PhaseRec,
                           DurationRec, EvictRec, RestoreRec>;

RecordType type_of(const Event& e) noexcept;
const char* name_of(RecordType t) noexcept;

// CRC-32 (IEEE, the value zlib's crc32 and Python's zlib.crc32 compute).
uint32_t crc32(const void* data, size_t len, uint32_t crc = 0) noexcept;

// LEB128 helpers (exposed for tests and the other implementation's checks).
void put_varint(std::string& out, uint64_t v);
inline uint64_t zigzag(int64_t v) noexcept {
  return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
}
inline int64_t unzigzag(uint64_t v) noexcept {
  return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1);
}

// ---- Writer ----------------------------------------------------------------
// Incremental: holds one block (at most 1 MiB of records) in memory and writes
// it when the next record would not fit, on flush(), and on close(), which
// also writes the end marker. A writer destroyed without close() writes its
// buffered block but no end marker (the file then reads as truncated, which is
// what it is). The writer does not validate the sequence of records (ids
// defined before use, live allocations): the reader does.
class Writer {
 public:
  Writer() = default;
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Creates (truncates) `path` and writes the header with `meta_json` (a JSON
  // object, at most 1 MiB; not parsed). False on failure, see error().
  bool open(const std::string& path, std::string_view meta_json) noexcept;
  // The same on a descriptor the caller opened for writing (its checks of
  // the path are its own, base/output_file.h), which the writer now owns
  // (closed on failure too); `path` names it in messages.
  bool open_fd(int fd, const std::string& path, std::string_view meta_json) noexcept;
  bool is_open() const noexcept { return fd_ >= 0; }

  // Each returns false, and writes nothing, on failure (error() says why):
  // I/O error, writer not open or closed, a field out of range (copy kind,
  // touch mode, phase), or a record that would not fit in one block. After an
  // I/O error every later call fails.
  bool write(const Event& e) noexcept;
  bool string(uint64_t id, std::string_view text) noexcept;
  bool alloc(uint64_t alloc, uint64_t size, uint64_t stream, uint64_t site) noexcept;
  bool free(uint64_t alloc, uint64_t stream) noexcept;
  bool launch(uint64_t stream, uint64_t name, uint64_t duration_ns,
              std::span<const TouchRec> touches) noexcept;
  bool copy(uint64_t stream, CopyKind kind, uint64_t bytes, uint64_t duration_ns, Ref dst,
            Ref src) noexcept;
  bool step(uint64_t step) noexcept;
  bool phase(PhaseKind phase) noexcept;
  bool duration(uint64_t launch_index, uint64_t duration_ns) noexcept;
  bool evict(uint64_t alloc, MoveCause cause) noexcept;
  bool restore(uint64_t alloc, MoveCause cause) noexcept;

  // Writes the buffered block (if any) to the file (write(2); no fsync).
  bool flush() noexcept;
  // Flushes, writes the end marker and closes the file. Idempotent.
  bool close() noexcept;

  uint64_t records() const noexcept { return records_; }
  // LAUNCH records written so far: the index the next LAUNCH will have.
  uint64_t launches() const noexcept { return launches_; }
  const std::string& error() const noexcept { return error_; }

 private:
  bool append(std::string_view record, bool is_launch) noexcept;
  bool move(RecordType type, uint64_t alloc, MoveCause cause) noexcept;
  bool write_all(const void* data, size_t len) noexcept;
  bool fail(std::string why) noexcept;

  int fd_ = -1;
  bool closed_ = false;
  bool broken_ = false;
  std::string path_;
  std::string block_;    // payload of the current block
  std::string scratch_;  // the record being encoded
  uint32_t block_count_ = 0;
  uint64_t records_ = 0;
  uint64_t launches_ = 0;
  std::string error_;
};

// ---- Reader ----------------------------------------------------------------
// Streaming: reads one block at a time and hands out its records, checking
// everything docs/record-format.md ("What a reader checks") lists. The first
// problem stops the reader; error() names its byte offset in the file.
struct ReadError {
  uint64_t offset = 0;
  std::string message;
  std::string to_string() const;  // "offset N: message"
};

class Reader {
 public:
  enum class Status { kEvent, kEnd, kError };

  Reader() = default;
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  // Opens the file and checks the header. False on failure (see error()).
  bool open(const std::string& path) noexcept;

  // The next record (kEvent), the end of a complete, valid file (kEnd), or
  // a problem (kError; the reader stays in that state).
  Status next(Event& out) noexcept;

  const std::string& meta() const noexcept { return meta_; }
  uint32_t version() const noexcept { return version_; }
  const ReadError& error() const noexcept { return error_; }
  // Strings defined so far (id -> text); nullptr if undefined.
  const std::string* string(uint64_t id) const noexcept;
  uint64_t records() const noexcept { return records_; }
  uint64_t launches() const noexcept { return launches_; }
  // Byte offset of the record last returned by next().
  uint64_t record_offset() const noexcept { return record_offset_; }
  // Size of a live allocation (0 if not live).
  uint64_t live_size(uint64_t alloc) const noexcept;
  // Whether a live allocation was last EVICTed (not RESTOREd since).
  bool evicted(uint64_t alloc) const noexcept { return evicted_.count(alloc) > 0; }

 private:
  enum class State { kClosed, kBlocks, kInBlock, kEnd, kError };
  bool fail(uint64_t offset, std::string message) noexcept;
  bool read_exact(void* dst, size_t len, uint64_t start, const char* what) noexcept;
  bool load_block() noexcept;
  bool parse_record(Event& out) noexcept;
  bool check_record(const Event& e) noexcept;
  bool check_trailing() noexcept;
  bool id_used(uint64_t id) const noexcept;
  void mark_used(uint64_t id);

  std::FILE* f_ = nullptr;
  uint64_t file_size_ = 0;
  uint64_t pos_ = 0;  // file offset of the next unread byte
  State state_ = State::kClosed;
  std::string meta_;
  uint32_t version_ = 0;
  ReadError error_;

  std::string block_;
  uint64_t block_start_ = 0;    // offset of the block's "BLK1"
  uint64_t payload_start_ = 0;  // offset of its first payload byte
  size_t block_pos_ = 0;
  uint32_t block_count_ = 0;
  uint32_t block_seen_ = 0;

  uint64_t records_ = 0;
  uint64_t launches_ = 0;
  uint64_t record_offset_ = 0;
  // The last STEP record returned (a file cut short says where it stopped).
  bool stepped_ = false;
  uint64_t last_step_ = 0;
  std::string where_stopped() const;
  std::unordered_map<uint64_t, std::string> strings_;
  std::unordered_map<uint64_t, uint64_t> live_;  // alloc id -> size
  std::unordered_set<uint64_t> evicted_;         // live ids EVICTed, not RESTOREd since
  std::map<uint64_t, uint64_t> used_ids_;        // disjoint [first, last] runs of ALLOC ids seen
};

}  // namespace spillway::trace
