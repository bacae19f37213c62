// trace::Writer: docs/record-format.md, "Layout" and "Records".
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "trace/trace.h"

namespace spillway::trace {
namespace {

void put_u8(std::string& out, uint8_t v) {
  out.push_back(static_cast<char>(v));
}
void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

}  // namespace

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

RecordType type_of(const Event& e) noexcept {
  return static_cast<RecordType>(e.index() + 1);
}

const char* name_of(RecordType t) noexcept {
  switch (t) {
    case RecordType::kString:
      return "STRING";
    case RecordType::kAlloc:
      return "ALLOC";
    case RecordType::kFree:
      return "FREE";
    case RecordType::kLaunch:
      return "LAUNCH";
    case RecordType::kCopy:
      return "COPY";
    case RecordType::kStep:
      return "STEP";
    case RecordType::kPhase:
      return "PHASE";
    case RecordType::kDuration:
      return "DURATION";
    case RecordType::kEvict:
      return "EVICT";
    case RecordType::kRestore:
      return "RESTORE";
  }
  return "?";
}

const char* name_of(MoveCause c) noexcept {
  switch (c) {
    case MoveCause::kBudget:
      return "budget";
    case MoveCause::kPressure:
      return "pressure";
    case MoveCause::kPrefetch:
      return "prefetch";
    case MoveCause::kOnDemand:
      return "on-demand";
  }
  return "?";
}

Writer::~Writer() {
  if (fd_ >= 0) {
    flush();
    ::close(fd_);
  }
}

bool Writer::fail(std::string why) noexcept {
  error_ = std::move(why);
  return false;
}

bool Writer::write_all(const void* data, size_t len) noexcept {
  const auto* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::write(fd_, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      broken_ = true;
      return fail("cannot write " + path_ + ": " + std::strerror(n < 0 ? errno : EIO));
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

bool Writer::open(const std::string& path, std::string_view meta_json) noexcept {
  if (fd_ >= 0 || closed_) return fail("writer already used: open() may be called once");
  if (meta_json.size() > kMaxMeta) return fail("meta is larger than 1 MiB");
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail("cannot create " + path + ": " + std::strerror(errno));
  return open_fd(fd, path, meta_json);
}

bool Writer::open_fd(int fd, const std::string& path, std::string_view meta_json) noexcept {
  if (fd_ >= 0 || closed_) {
    ::close(fd);
    return fail("writer already used: open() may be called once");
  }
  if (meta_json.size() > kMaxMeta) {
    ::close(fd);
    return fail("meta is larger than 1 MiB");
  }
  path_ = path;
  fd_ = fd;
  std::string h;
  h.reserve(20 + meta_json.size());
  h.append("SPWTRACE", 8);
  put_u32(h, kVersion);
  put_u32(h, static_cast<uint32_t>(meta_json.size()));
  h.append(meta_json);
  put_u32(h, crc32(meta_json.data(), meta_json.size()));
  block_.reserve(kMaxBlockPayload);
  return write_all(h.data(), h.size());
}

bool Writer::append(std::string_view record, bool is_launch) noexcept {
  if (fd_ < 0) return fail(closed_ ? "writer is closed" : "writer is not open");
  if (broken_) return false;
  if (record.size() > kMaxBlockPayload) {
    return fail("a " + std::string(name_of(static_cast<RecordType>(record[0]))) + " record of " +
                std::to_string(record.size()) + " bytes does not fit in a block (1 MiB)");
  }
  if (block_.size() + record.size() > kMaxBlockPayload && !flush()) return false;
  block_.append(record);
  ++block_count_;
  ++records_;
  if (is_launch) ++launches_;
  return true;
}

bool Writer::flush() noexcept {
  if (fd_ < 0) return fail(closed_ ? "writer is closed" : "writer is not open");
  if (broken_) return false;
  if (block_.empty()) return true;
  std::string h;
  h.append("BLK1", 4);
  put_u32(h, static_cast<uint32_t>(block_.size()));
  put_u32(h, block_count_);
  put_u32(h, crc32(block_.data(), block_.size()));
  if (!write_all(h.data(), h.size()) || !write_all(block_.data(), block_.size())) return false;
  block_.clear();
  block_count_ = 0;
  return true;
}

bool Writer::close() noexcept {
  if (closed_) return true;
  if (fd_ < 0) return fail("writer is not open");
  bool ok = flush();
  if (ok) {
    std::string e;
    e.append("END1", 4);
    std::string n;
    put_u64(n, records_);
    e.append(n);
    put_u32(e, crc32(n.data(), n.size()));
    ok = write_all(e.data(), e.size());
  }
  if (::close(fd_) != 0 && ok) ok = fail("cannot close " + path_ + ": " + std::strerror(errno));
  fd_ = -1;
  closed_ = true;
  return ok;
}

bool Writer::string(uint64_t id, std::string_view text) noexcept {
  scratch_.clear();
  put_u8(scratch_, static_cast<uint8_t>(RecordType::kString));
  put_varint(scratch_, id);
  put_varint(scratch_, text.size());
  scratch_.append(text);
  return append(scratch_, false);
}

bool Writer::alloc(uint64_t alloc, uint64_t size, uint64_t stream, uint64_t site) noexcept {
  scratch_.clear();
  put_u8(scratch_, static_cast<uint8_t>(RecordType::kAlloc));
  put_varint(scratch_, alloc);
  put_varint(scratch_, size);
  put_varint(scratch_, stream);
  put_varint(scratch_, site);
  return append(scratch_, false);
}

bool Writer::free(uint64_t alloc, uint64_t stream) noexcept {
  scratch_.clear();
  put_u8(scratch_, static_cast<uint8_t>(RecordType::kFree));
  put_varint(scratch_, alloc);
  put_varint(scratch_, stream);
  return append(scratch_, false);
}

bool Writer::launch(uint64_t stream, uint64_t name, uint64_t duration_ns,
                    std::span<const TouchRec> touches) noexcept {
  scratch_.clear();
  put_u8(scratch_, static_cast<uint8_t>(RecordType::kLaunch));
  put_varint(scratch_, stream);
  put_varint(scratch_, name);
  put_varint(scratch_, duration_ns);
  put_varint(scratch_, touches.size());
  for (const TouchRec& t : touches) {
    if (t.mode > kModeReadWrite)
      return fail("touch mode " + std::to_string(t.mode) + " is not 0-3");
    put_varint(scratch_, t.alloc);
    put_varint(scratch_, t.offset);
    put_varint(scratch_, t.length);
    put_u8(scratch_, t.mode);
  }
  return append(scratch_, true);
}

bool Writer::copy(uint64_t stream, CopyKind kind, uint64_t bytes, uint64_t duration_ns, Ref dst,
                  Ref src) noexcept {
  const auto k = static_cast<uint8_t>(kind);
  if (k < 1 || k > 4) return fail("copy kind " + std::to_string(k) + " is not 1-4");
  scratch_.clear();
  put_u8(scratch_, static_cast<uint8_t>(RecordType::kCopy));
  put_varint(scratch_, stream);
  put_u8(scratch_, k);
  put_varint(scratch_, bytes);
  put_varint(scratch_, duration_ns);
  put_varint(scratch_, dst.alloc);
  put_varint(scratch_, dst.offset);
  put_varint(scratch_, src.alloc);
  put_varint(scratch_, src.offset);
  return append(scratch_, false);
}

bool Writer::step(uint64_t step) noexcept {
  scratch_.clear();
  put_u8(scratch_, static_cast<uint8_t>(RecordType::kStep));
  put_varint(scratch_, step);
  // The block ends at each step: a file cut short (SIGKILL, a crash) reads
  // back up to the last step begun, whatever the size of the steps.
  return append(scratch_, false) && flush();
}

bool Writer::phase(PhaseKind phase) noexcept {
  const auto p = static_cast<uint8_t>(phase);
  if (p > 3) return fail("phase " + std::to_string(p) + " is not 0-3");
  scratch_.clear();
  put_u8(scratch_, static_cast<uint8_t>(RecordType::kPhase));
  put_u8(scratch_, p);
  return append(scratch_, false);
}

bool Writer::duration(uint64_t launch_index, uint64_t duration_ns) noexcept {
  scratch_.clear();
  put_u8(scratch_, static_cast<uint8_t>(RecordType::kDuration));
  put_varint(scratch_, launch_index);
  put_varint(scratch_, duration_ns);
  return append(scratch_, false);
}

bool Writer::evict(uint64_t alloc, MoveCause cause) noexcept {
  return move(RecordType::kEvict, alloc, cause);
}

bool Writer::restore(uint64_t alloc, MoveCause cause) noexcept {
  return move(RecordType::kRestore, alloc, cause);
}

bool Writer::move(RecordType type, uint64_t alloc, MoveCause cause) noexcept {
  const auto c = static_cast<uint8_t>(cause);
  if (c > 3) return fail("move cause " + std::to_string(c) + " is not 0-3");
  scratch_.clear();
  put_u8(scratch_, static_cast<uint8_t>(type));
  put_varint(scratch_, alloc);
  put_u8(scratch_, c);
  return append(scratch_, false);
}

bool Writer::write(const Event& e) noexcept {
  return std::visit(
      [this](const auto& r) -> bool {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, StringRec>) return string(r.id, r.text);
        if constexpr (std::is_same_v<T, AllocRec>) return alloc(r.alloc, r.size, r.stream, r.site);
        if constexpr (std::is_same_v<T, FreeRec>) return free(r.alloc, r.stream);
        if constexpr (std::is_same_v<T, LaunchRec>)
          return launch(r.stream, r.name, r.duration_ns, r.touches);
        if constexpr (std::is_same_v<T, CopyRec>)
          return copy(r.stream, r.kind, r.bytes, r.duration_ns, r.dst, r.src);
        if constexpr (std::is_same_v<T, StepRec>) return step(r.step);
        if constexpr (std::is_same_v<T, PhaseRec>) return phase(r.phase);
        if constexpr (std::is_same_v<T, DurationRec>) return duration(r.launch, r.duration_ns);
        if constexpr (std::is_same_v<T, EvictRec>) return evict(r.alloc, r.cause);
        if constexpr (std::is_same_v<T, RestoreRec>) return restore(r.alloc, r.cause);
      },
      e);
}

}  // namespace spillway::trace
