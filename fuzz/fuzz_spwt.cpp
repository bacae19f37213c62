// Fuzz target: the .spwt reader (trace/src/reader.cpp) as the replayer drives
// it (replay::analyze, harness/replay/analysis.cpp: every record read and
// checked, then the meta's layer count and the per-step analysis). The input
// is the file. It is read twice: as it is, and with every CRC the framing
// lets us find set right, so that mutations reach the records and the meta
// instead of stopping at the first checksum.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz_check.h"
#include "replay.h"
#include "trace/trace.h"

namespace {

uint32_t get_u32(const std::string& f, size_t at) {
  uint32_t v = 0;
  std::memcpy(&v, f.data() + at, 4);  // little-endian host (x86-64, arm64)
  return v;
}
void put_crc(std::string& f, size_t at, size_t from, size_t len) {
  const uint32_t crc = spillway::trace::crc32(f.data() + from, len);
  std::memcpy(f.data() + at, &crc, 4);
}

// Sets the meta, block and end-marker CRCs right, as far as the lengths make
// sense (docs/record-format.md, "Layout").
std::string fix_crcs(std::string f) {
  if (f.size() < 16 || f.compare(0, 8, "SPWTRACE") != 0) return f;
  const uint64_t meta_len = get_u32(f, 12);
  if (16 + meta_len + 4 > f.size()) return f;
  put_crc(f, 16 + meta_len, 16, meta_len);
  size_t pos = 16 + meta_len + 4;
  while (pos + 16 <= f.size()) {
    if (f.compare(pos, 4, "END1") == 0) {
      put_crc(f, pos + 12, pos + 4, 8);
      break;
    }
    if (f.compare(pos, 4, "BLK1") != 0) break;
    const uint64_t len = get_u32(f, pos + 4);
    if (len == 0 || pos + 16 + len > f.size()) break;
    put_crc(f, pos + 12, pos + 16, len);
    pos += 16 + len;
  }
  return f;
}

// One file the reader can open by name: a memfd, seen as /proc/self/fd/N.
const std::string& write_file(const std::string& bytes) {
  static const int fd = memfd_create("fuzz.spwt", MFD_CLOEXEC);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  FUZZ_CHECK(fd >= 0, "memfd_create failed");
  FUZZ_CHECK(ftruncate(fd, 0) == 0, "ftruncate failed");
  FUZZ_CHECK(pwrite(fd, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size()),
             "pwrite failed");
  return path;
}

void read_as_the_replayer_does(const std::string& bytes) {
  replay::Analysis a;
  std::string error;
  const bool ok = replay::analyze(write_file(bytes), 0, a, error);
  if (!ok) {
    FUZZ_CHECK(error.rfind("offset ", 0) == 0, "an error without its offset: '%s'", error.c_str());
    return;
  }
  FUZZ_CHECK(a.layers > 0, "%d layers", a.layers);
  FUZZ_CHECK(a.phase.size() == a.events.size() && a.step.size() == a.events.size(),
             "per-event tables of the wrong size");
  FUZZ_CHECK(a.layer_end.size() == a.steps && a.compute_ns.size() == a.steps,
             "per-step tables of the wrong size");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string raw(reinterpret_cast<const char*>(data), size);
  read_as_the_replayer_does(raw);
  const std::string fixed = fix_crcs(raw);
  if (fixed != raw) read_as_the_replayer_does(fixed);
  return 0;
}
