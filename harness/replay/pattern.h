// The data pattern the replayer writes and checks: byte `o` of allocation `a`
// is a fixed function of (a, o), so a byte read back is right exactly when it
// equals the function, wherever the block has been in between.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

namespace replay {

inline uint64_t pattern_word(uint64_t alloc, uint64_t word) {
  uint64_t x = alloc * 0x9E3779B97F4A7C15ull ^ (word + 0x632BE59BD9B4E019ull);
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}

inline uint8_t pattern_byte(uint64_t alloc, uint64_t offset) {
  return static_cast<uint8_t>(pattern_word(alloc, offset >> 3) >> (8 * (offset & 7)));
}

// Writes the pattern of [offset, offset + len) of `alloc` at `dst`.
inline void pattern_fill(unsigned char* dst, uint64_t alloc, uint64_t offset, uint64_t len) {
  uint64_t o = offset, end = offset + len;
  for (; o < end && (o & 7); ++o) *dst++ = pattern_byte(alloc, o);
  for (; o + 8 <= end; o += 8, dst += 8) {
    const uint64_t w = pattern_word(alloc, o >> 3);
    std::memcpy(dst, &w, 8);
  }
  for (; o < end; ++o) *dst++ = pattern_byte(alloc, o);
}

// Checks [offset, offset + len) of `alloc` at `src`. Returns the offset (in
// the allocation) of the first wrong byte, or UINT64_MAX if all are right.
inline uint64_t pattern_check(const unsigned char* src, uint64_t alloc, uint64_t offset,
                              uint64_t len) {
  uint64_t o = offset, end = offset + len;
  for (; o < end && (o & 7); ++o, ++src) {
    if (*src != pattern_byte(alloc, o)) return o;
  }
  for (; o + 8 <= end; o += 8, src += 8) {
    uint64_t w;
    std::memcpy(&w, src, 8);
    if (w != pattern_word(alloc, o >> 3)) {
      for (uint64_t k = 0; k < 8; ++k) {
        if (src[k] != pattern_byte(alloc, o + k)) return o + k;
      }
    }
  }
  for (; o < end; ++o, ++src) {
    if (*src != pattern_byte(alloc, o)) return o;
  }
  return UINT64_MAX;
}

// Disjoint, merged [begin, end) ranges: which bytes of an allocation hold
// its pattern (have been written since it was allocated).
class Ranges {
 public:
  void add(uint64_t b, uint64_t e) {
    if (b >= e) return;
    auto it = r_.upper_bound(b);
    if (it != r_.begin()) {
      auto p = std::prev(it);
      if (p->second >= b) {
        b = p->first;
        e = std::max(e, p->second);
        it = r_.erase(p);
      }
    }
    while (it != r_.end() && it->first <= e) {
      e = std::max(e, it->second);
      it = r_.erase(it);
    }
    r_.emplace(b, e);
  }
  // The parts of [b, e) that are in the set.
  std::vector<std::pair<uint64_t, uint64_t>> intersect(uint64_t b, uint64_t e) const {
    std::vector<std::pair<uint64_t, uint64_t>> out;
    auto it = r_.upper_bound(b);
    if (it != r_.begin()) --it;
    for (; it != r_.end() && it->first < e; ++it) {
      const uint64_t lo = std::max(b, it->first), hi = std::min(e, it->second);
      if (lo < hi) out.emplace_back(lo, hi);
    }
    return out;
  }
  uint64_t total() const {
    uint64_t n = 0;
    for (auto& [b, e] : r_) n += e - b;
    return n;
  }

 private:
  std::map<uint64_t, uint64_t> r_;
};

}  // namespace replay
