// trace::Reader: docs/record-format.md, "What a reader checks".
//
// Offsets in errors: a framing problem (magic, version, a length, a count, a
// CRC, a truncated file, bytes after the end) is reported at the field or
// structure it concerns (a CRC mismatch at the start of what the CRC
// protects: offset 16 for meta, the block's "BLK1", the end marker's "END1");
// a file cut short at its length; a malformed field (varint, string bytes) at
// the field's first byte; a semantic problem (ids, liveness, ranges) at the
// record's type byte.
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <iterator>

#include "trace/trace.h"

namespace spillway::trace {
namespace {

uint32_t get_u32(const unsigned char* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
uint64_t get_u64(const unsigned char* p) {
  return uint64_t{get_u32(p)} | uint64_t{get_u32(p + 4)} << 32;
}

// Parses fields from one block's payload.
class Cursor {
 public:
  Cursor(const std::string& b, size_t pos) : b_(b), pos_(pos) {}
  size_t pos() const { return pos_; }
  // Error: where and why; empty why means success.
  size_t err_at = 0;
  std::string why;

  bool varint(uint64_t& v) {
    const size_t start = pos_;
    v = 0;
    for (int i = 0; i < 10; ++i) {
      if (pos_ >= b_.size()) return bad(start, "varint runs past the end of its block");
      const auto byte = static_cast<unsigned char>(b_[pos_++]);
      if (i == 9 && byte > 1) {
        return bad(start, (byte & 0x80) ? "varint is longer than 10 bytes"
                                        : "varint does not fit in 64 bits");
      }
      v |= uint64_t{byte & 0x7Fu} << (7 * i);
      if (!(byte & 0x80)) return true;
    }
    return bad(start, "varint is longer than 10 bytes");  // unreachable: i == 9 returns above
  }
  bool u8(uint8_t& v, const char* what) {
    if (pos_ >= b_.size()) return bad(pos_, std::string(what) + " runs past the end of its block");
    v = static_cast<uint8_t>(b_[pos_++]);
    return true;
  }
  bool bytes(std::string& out, uint64_t n) {
    if (n > b_.size() - pos_)
      return bad(pos_, "string of " + std::to_string(n) + " bytes runs past the end of its block");
    out.assign(b_, pos_, n);
    pos_ += n;
    return true;
  }
  size_t remaining() const { return b_.size() - pos_; }
  bool bad(size_t at, std::string w) {
    err_at = at;
    why = std::move(w);
    return false;
  }

 private:
  const std::string& b_;
  size_t pos_;
};

bool in_range(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

}  // namespace

std::string ReadError::to_string() const {
  return "offset " + std::to_string(offset) + ": " + message;
}

Reader::~Reader() {
  if (f_) std::fclose(f_);
}

std::string Reader::where_stopped() const {
  // A writer ends a block at each step (writer.cpp): the records before the
  // cut are whole steps, and the last one begun.
  std::string s = "; the " + std::to_string(records_) + " records before it read back";
  if (stepped_) s += ", up to step " + std::to_string(last_step_) + " begun";
  return s;
}

bool Reader::fail(uint64_t offset, std::string message) noexcept {
  if (state_ != State::kError) {
    error_.offset = offset;
    error_.message = std::move(message);
    state_ = State::kError;
  }
  return false;
}

bool Reader::read_exact(void* dst, size_t len, uint64_t start, const char* what) noexcept {
  if (pos_ + len > file_size_) {
    return fail(file_size_, std::string("file is truncated: it ends at offset ") +
                                std::to_string(file_size_) + " inside the " + what +
                                " starting at offset " + std::to_string(start) + where_stopped());
  }
  if (std::fread(dst, 1, len, f_) != len) {
    return fail(pos_, std::string("read error inside the ") + what + ": " + std::strerror(errno));
  }
  pos_ += len;
  return true;
}

bool Reader::open(const std::string& path) noexcept {
  if (state_ != State::kClosed) return fail(0, "reader already opened");
  f_ = std::fopen(path.c_str(), "rbe");
  if (!f_) return fail(0, "cannot open " + path + ": " + std::strerror(errno));
  struct stat st;
  if (fstat(fileno(f_), &st) != 0 || !S_ISREG(st.st_mode)) {
    return fail(0, path + " is not a regular file");
  }
  file_size_ = static_cast<uint64_t>(st.st_size);
  unsigned char h[16];
  if (!read_exact(h, 8, 0, "header")) return false;
  if (std::memcmp(h, "SPWTRACE", 8) != 0) return fail(0, "not a spillway trace (bad magic)");
  if (!read_exact(h + 8, 8, 0, "header")) return false;
  version_ = get_u32(h + 8);
  if (version_ < kOldestVersion || version_ > kVersion) {
    return fail(8, "unsupported version " + std::to_string(version_) + " (this reader knows " +
                       std::to_string(kOldestVersion) + " to " + std::to_string(kVersion) + ")");
  }
  const uint32_t meta_len = get_u32(h + 12);
  if (meta_len > kMaxMeta) {
    return fail(12, "meta length " + std::to_string(meta_len) + " is larger than 1 MiB");
  }
  meta_.resize(meta_len);
  unsigned char crc[4];
  if (!read_exact(meta_.data(), meta_len, 0, "header") || !read_exact(crc, 4, 0, "header")) {
    return false;
  }
  if (crc32(meta_.data(), meta_.size()) != get_u32(crc)) return fail(16, "meta CRC mismatch");
  state_ = State::kBlocks;
  return true;
}

bool Reader::load_block() noexcept {
  const uint64_t start = pos_;
  if (pos_ == file_size_) {
    return fail(file_size_,
                "file is truncated: the end marker is missing (the file ends at offset " +
                    std::to_string(file_size_) + ")" + where_stopped());
  }
  unsigned char h[16];
  if (!read_exact(h, 4, start, "block or end marker")) return false;
  if (std::memcmp(h, "END1", 4) == 0) {
    if (!read_exact(h + 4, 12, start, "end marker")) return false;
    if (crc32(h + 4, 8) != get_u32(h + 12)) return fail(start, "end marker CRC mismatch");
    const uint64_t n = get_u64(h + 4);
    if (n != records_) {
      return fail(start + 4, "end marker counts " + std::to_string(n) +
                                 " records, the blocks hold " + std::to_string(records_));
    }
    if (pos_ != file_size_) {
      return fail(pos_, std::to_string(file_size_ - pos_) + " bytes follow the end marker");
    }
    state_ = State::kEnd;
    return true;
  }
  if (std::memcmp(h, "BLK1", 4) != 0) {
    return fail(start, "expected a block (BLK1) or the end marker (END1)");
  }
  if (!read_exact(h + 4, 12, start, "block header")) return false;
  const uint32_t length = get_u32(h + 4);
  const uint32_t count = get_u32(h + 8);
  if (length == 0 || length > kMaxBlockPayload) {
    return fail(start + 4, "block length " + std::to_string(length) + " is not 1 .. 1 MiB");
  }
  if (count == 0) return fail(start + 8, "block record count is 0");
  block_.resize(length);
  if (!read_exact(block_.data(), length, start, "block")) return false;
  if (crc32(block_.data(), length) != get_u32(h + 12)) {
    return fail(start, "block CRC mismatch (the block starting here is damaged)");
  }
  block_start_ = start;
  payload_start_ = start + 16;
  block_pos_ = 0;
  block_count_ = count;
  block_seen_ = 0;
  state_ = State::kInBlock;
  return true;
}

bool Reader::parse_record(Event& out) noexcept {
  Cursor c(block_, block_pos_);
  const uint64_t at = payload_start_ + block_pos_;
  uint8_t type = 0;
  c.u8(type, "record");
  auto bad = [&]() { return fail(payload_start_ + c.err_at, c.why); };
  switch (static_cast<RecordType>(type)) {
    case RecordType::kString: {
      StringRec r;
      uint64_t len = 0;
      if (!c.varint(r.id) || !c.varint(len) || !c.bytes(r.text, len)) return bad();
      out = std::move(r);
      break;
    }
    case RecordType::kAlloc: {
      AllocRec r;
      if (!c.varint(r.alloc) || !c.varint(r.size) || !c.varint(r.stream) || !c.varint(r.site)) {
        return bad();
      }
      out = r;
      break;
    }
    case RecordType::kFree: {
      FreeRec r;
      if (!c.varint(r.alloc) || !c.varint(r.stream)) return bad();
      out = r;
      break;
    }
    case RecordType::kLaunch: {
      LaunchRec r;
      uint64_t n = 0;
      if (!c.varint(r.stream) || !c.varint(r.name) || !c.varint(r.duration_ns)) return bad();
      const size_t n_at = c.pos();
      if (!c.varint(n)) return bad();
      if (n > c.remaining() / 4) {  // a touch takes at least 4 bytes
        return fail(payload_start_ + n_at, "LAUNCH claims " + std::to_string(n) +
                                               " touches, more than its block can hold");
      }
      r.touches.resize(n);
      for (TouchRec& t : r.touches) {
        if (!c.varint(t.alloc) || !c.varint(t.offset) || !c.varint(t.length) ||
            !c.u8(t.mode, "touch mode")) {
          return bad();
        }
      }
      out = std::move(r);
      break;
    }
    case RecordType::kCopy: {
      CopyRec r;
      uint8_t kind = 0;
      if (!c.varint(r.stream) || !c.u8(kind, "copy kind") || !c.varint(r.bytes) ||
          !c.varint(r.duration_ns) || !c.varint(r.dst.alloc) || !c.varint(r.dst.offset) ||
          !c.varint(r.src.alloc) || !c.varint(r.src.offset)) {
        return bad();
      }
      if (kind < 1 || kind > 4)
        return fail(at, "COPY kind " + std::to_string(kind) + " is not 1-4");
      r.kind = static_cast<CopyKind>(kind);
      out = r;
      break;
    }
    case RecordType::kStep: {
      StepRec r;
      if (!c.varint(r.step)) return bad();
      stepped_ = true;
      last_step_ = r.step;
      out = r;
      break;
    }
    case RecordType::kPhase: {
      uint8_t p = 0;
      if (!c.u8(p, "phase")) return bad();
      if (p > 3) return fail(at, "PHASE " + std::to_string(p) + " is not 0-3");
      out = PhaseRec{static_cast<PhaseKind>(p)};
      break;
    }
    case RecordType::kDuration: {
      DurationRec r;
      if (!c.varint(r.launch) || !c.varint(r.duration_ns)) return bad();
      out = r;
      break;
    }
    case RecordType::kEvict:
    case RecordType::kRestore: {
      if (version_ < 2) {
        return fail(at, "record type " + std::to_string(type) + " is unknown in version " +
                            std::to_string(version_) + " (EVICT and RESTORE came in version 2)");
      }
      uint64_t alloc = 0;
      uint8_t cause = 0;
      if (!c.varint(alloc) || !c.u8(cause, "move cause")) return bad();
      if (cause > 3)
        return fail(at, std::string(name_of(static_cast<RecordType>(type))) + " cause " +
                            std::to_string(cause) + " is not 0-3");
      if (static_cast<RecordType>(type) == RecordType::kEvict)
        out = EvictRec{alloc, static_cast<MoveCause>(cause)};
      else
        out = RestoreRec{alloc, static_cast<MoveCause>(cause)};
      break;
    }
    default:
      return fail(at, "unknown record type " + std::to_string(type));
  }
  record_offset_ = at;
  block_pos_ = c.pos();
  return true;
}

bool Reader::id_used(uint64_t id) const noexcept {
  auto it = used_ids_.upper_bound(id);
  if (it == used_ids_.begin()) return false;
  --it;
  return id <= it->second;
}

void Reader::mark_used(uint64_t id) {
  // Runs of consecutive ids are merged, so a trace numbering its allocations
  // 1, 2, 3, ... costs one entry.
  auto next = used_ids_.upper_bound(id);
  if (next != used_ids_.begin()) {
    auto prev = std::prev(next);
    if (prev->second + 1 == id) {
      prev->second = id;
      if (next != used_ids_.end() && next->first == id + 1) {
        prev->second = next->second;
        used_ids_.erase(next);
      }
      return;
    }
  }
  if (next != used_ids_.end() && next->first == id + 1) {
    const uint64_t last = next->second;
    used_ids_.erase(next);
    used_ids_.emplace(id, last);
    return;
  }
  used_ids_.emplace(id, id);
}

uint64_t Reader::live_size(uint64_t alloc) const noexcept {
  auto it = live_.find(alloc);
  return it == live_.end() ? 0 : it->second;
}

const std::string* Reader::string(uint64_t id) const noexcept {
  auto it = strings_.find(id);
  return it == strings_.end() ? nullptr : &it->second;
}

bool Reader::check_record(const Event& e) noexcept {
  const uint64_t at = record_offset_;
  auto need_string = [&](uint64_t id, const char* what) {
    if (id == 0 || strings_.count(id)) return true;
    return fail(
        at, std::string(what) + " string " + std::to_string(id) + " is used before it is defined");
  };
  auto need_live = [&](uint64_t id, const std::string& what) {
    if (live_.count(id)) return true;
    return fail(at, what + " names allocation " + std::to_string(id) + ", which is not live");
  };
  auto need_range = [&](uint64_t id, uint64_t off, uint64_t len, const std::string& what) {
    const uint64_t size = live_.at(id);
    if (in_range(off, len, size)) return true;
    return fail(at, what + " range [" + std::to_string(off) + ", +" + std::to_string(len) +
                        ") falls outside allocation " + std::to_string(id) + " of " +
                        std::to_string(size) + " bytes");
  };
  switch (type_of(e)) {
    case RecordType::kString: {
      const auto& r = std::get<StringRec>(e);
      if (r.id == 0) return fail(at, "STRING id 0 is reserved (it means none)");
      if (strings_.count(r.id)) {
        return fail(at, "STRING " + std::to_string(r.id) + " is defined twice");
      }
      strings_.emplace(r.id, r.text);
      return true;
    }
    case RecordType::kAlloc: {
      const auto& r = std::get<AllocRec>(e);
      if (r.alloc == 0) return fail(at, "ALLOC id 0 is reserved");
      if (id_used(r.alloc)) return fail(at, "ALLOC reuses id " + std::to_string(r.alloc));
      if (!need_string(r.site, "ALLOC site")) return false;
      mark_used(r.alloc);
      live_.emplace(r.alloc, r.size);
      return true;
    }
    case RecordType::kFree: {
      const auto& r = std::get<FreeRec>(e);
      if (!need_live(r.alloc, "FREE")) return false;
      live_.erase(r.alloc);
      evicted_.erase(r.alloc);  // an evicted allocation may be freed
      return true;
    }
    case RecordType::kEvict: {
      const auto& r = std::get<EvictRec>(e);
      if (!need_live(r.alloc, "EVICT")) return false;
      if (!evicted_.insert(r.alloc).second)
        return fail(at, "EVICT of allocation " + std::to_string(r.alloc) + ", already evicted");
      return true;
    }
    case RecordType::kRestore: {
      const auto& r = std::get<RestoreRec>(e);
      if (!need_live(r.alloc, "RESTORE")) return false;
      if (evicted_.erase(r.alloc) == 0)
        return fail(at,
                    "RESTORE of allocation " + std::to_string(r.alloc) + ", which is not evicted");
      return true;
    }
    case RecordType::kLaunch: {
      const auto& r = std::get<LaunchRec>(e);
      if (!need_string(r.name, "LAUNCH name")) return false;
      for (size_t i = 0; i < r.touches.size(); ++i) {
        const TouchRec& t = r.touches[i];
        const std::string what = "touch " + std::to_string(i) + " of a LAUNCH";
        if (t.mode > kModeReadWrite) {
          return fail(at, what + " has mode " + std::to_string(t.mode) + " (not 0-3)");
        }
        if (!need_live(t.alloc, what) || !need_range(t.alloc, t.offset, t.length, what)) {
          return false;
        }
      }
      ++launches_;
      return true;
    }
    case RecordType::kCopy: {
      const auto& r = std::get<CopyRec>(e);
      if (r.kind == CopyKind::kMemset && (r.src.alloc != 0 || r.src.offset != 0)) {
        return fail(at, "a memset COPY has a source (it must be written as 0, 0)");
      }
      for (const auto& [ref, what] : {std::pair{r.dst, "COPY dst"}, std::pair{r.src, "COPY src"}}) {
        if (ref.alloc == 0) continue;
        if (!need_live(ref.alloc, what) || !need_range(ref.alloc, ref.offset, r.bytes, what)) {
          return false;
        }
      }
      return true;
    }
    case RecordType::kDuration: {
      const auto& r = std::get<DurationRec>(e);
      if (r.launch >= launches_) {
        return fail(at, "DURATION names LAUNCH " + std::to_string(r.launch) + ", but only " +
                            std::to_string(launches_) + " came before it");
      }
      return true;
    }
    case RecordType::kStep:
    case RecordType::kPhase:
      return true;
  }
  return true;
}

bool Reader::check_trailing() noexcept {
  // Called when a block's `count` records have been read.
  if (block_pos_ != block_.size()) {
    return fail(block_start_ + 8, "block's " + std::to_string(block_count_) + " records end " +
                                      std::to_string(block_.size() - block_pos_) +
                                      " bytes before its payload does");
  }
  state_ = State::kBlocks;
  return true;
}

Reader::Status Reader::next(Event& out) noexcept {
  for (;;) {
    switch (state_) {
      case State::kClosed:
        fail(0, "reader is not open");
        return Status::kError;
      case State::kError:
        return Status::kError;
      case State::kEnd:
        return Status::kEnd;
      case State::kBlocks:
        if (!load_block()) return Status::kError;
        continue;
      case State::kInBlock:
        if (block_seen_ == block_count_) {
          if (!check_trailing()) return Status::kError;
          continue;
        }
        if (block_pos_ == block_.size()) {
          fail(block_start_ + 8, "block header counts " + std::to_string(block_count_) +
                                     " records, its payload holds " + std::to_string(block_seen_));
          return Status::kError;
        }
        if (!parse_record(out) || !check_record(out)) return Status::kError;
        ++block_seen_;
        ++records_;
        return Status::kEvent;
    }
  }
}

}  // namespace spillway::trace
