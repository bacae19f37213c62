// CRC-32, IEEE 802.3 polynomial (reflected 0xEDB88320), initial value and
// final xor 0xFFFFFFFF: the value zlib's crc32() computes. Slicing by 4.
#include <array>
#include <bit>
#include <cstring>

#include "trace/trace.h"

namespace spillway::trace {
namespace {

using Tables = std::array<std::array<uint32_t, 256>, 4>;

constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (int s = 1; s < 4; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  }
  return t;
}

constexpr Tables kTables = make_tables();

}  // namespace

uint32_t crc32(const void* data, size_t len, uint32_t crc) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (len >= 4) {
    uint32_t w;
    std::memcpy(&w, p, 4);
    if constexpr (std::endian::native == std::endian::big) w = __builtin_bswap32(w);
    c ^= w;
    c = kTables[3][c & 0xFF] ^ kTables[2][(c >> 8) & 0xFF] ^ kTables[1][(c >> 16) & 0xFF] ^
        kTables[0][c >> 24];
    p += 4;
    len -= 4;
  }
  while (len--) c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xFF];
  return ~c;
}

}  // namespace spillway::trace
