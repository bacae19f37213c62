// Fuzz target: the size/percent parser (base/size.*) that every SPILLWAY_*
// size and the launcher's size options go through. The input is the text.
// Besides crashes, leaks and undefined behaviour it checks the grammar
// docs/config.md promises: what is accepted is digits, an optional fraction
// and one of the units (or a percentage in (0, 100]), and a size is below
// 1.8e19 bytes.
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz_check.h"
#include "size.h"

namespace {

// The documented shape of a size: [0-9]+ ( '.' [0-9]+ )? unit?
bool size_shape(const std::string& t, bool* fraction, std::string* unit) {
  size_t i = 0;
  while (i < t.size() && t[i] >= '0' && t[i] <= '9') ++i;
  if (i == 0) return false;
  *fraction = false;
  if (i < t.size() && t[i] == '.') {
    size_t j = i + 1;
    while (j < t.size() && t[j] >= '0' && t[j] <= '9') ++j;
    if (j == i + 1) return false;
    *fraction = true;
    i = j;
  }
  *unit = t.substr(i);
  for (const char* u : {"", "B", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "TB"})
    if (*unit == u) return true;
  return false;
}

uint64_t unit_multiplier(const std::string& unit) {
  static const std::pair<const char*, uint64_t> kMult[] = {{"", 1},
                                                           {"B", 1},
                                                           {"KiB", 1ull << 10},
                                                           {"MiB", 1ull << 20},
                                                           {"GiB", 1ull << 30},
                                                           {"TiB", 1ull << 40},
                                                           {"KB", 1000},
                                                           {"MB", 1000000},
                                                           {"GB", 1000000000},
                                                           {"TB", 1000000000000}};
  for (const auto& [u, m] : kMult)
    if (unit == u) return m;
  return 0;
}

// The bytes a size of at most 8 integer and 12 fraction digits stands for,
// rounded down, computed in 128-bit integers; -1 when it has more digits.
__int128 exact_bytes(const std::string& t, const std::string& unit) {
  const uint64_t mult = unit_multiplier(unit);
  const std::string num = t.substr(0, t.size() - unit.size());
  const size_t dot = num.find('.');
  const std::string whole = num.substr(0, dot),
                    frac = dot == std::string::npos ? "" : num.substr(dot + 1);
  if (whole.size() > 8 || frac.size() > 12) return -1;
  __int128 n = 0, scale = 1;
  for (char ch : whole + frac) n = n * 10 + (ch - '0');
  for (size_t i = 0; i < frac.size(); ++i) scale *= 10;
  return n * mult / scale;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);

  double v = -1;
  const size_t used = spillway::decimal_prefix(text, &v);
  FUZZ_CHECK(used <= text.size(), "decimal_prefix used %zu of %zu", used, text.size());
  if (used > 0) FUZZ_CHECK(v >= 0, "decimal_prefix gave %g", v);

  const auto bytes = spillway::parse_bytes(text);
  if (bytes) {
    bool fraction = false;
    std::string unit;
    FUZZ_CHECK(size_shape(text, &fraction, &unit), "accepted '%s'", text.c_str());
    FUZZ_CHECK(*bytes < 18000000000000000000ull, "'%s' is %llu bytes", text.c_str(),
               static_cast<unsigned long long>(*bytes));
    FUZZ_CHECK(!spillway::format_bytes(*bytes).empty(), "empty format_bytes");
    // Near the value of the text, whatever its length.
    const long double approx =
        std::strtold(text.substr(0, text.size() - unit.size()).c_str(), nullptr) *
        static_cast<long double>(unit_multiplier(unit));
    FUZZ_CHECK(std::fabs(approx - static_cast<long double>(*bytes)) <= 1 + approx * 1e-15L,
               "'%s' is %llu bytes", text.c_str(), static_cast<unsigned long long>(*bytes));
    // "rounded down to whole bytes" (docs/config.md), exactly.
    const __int128 exact = exact_bytes(text, unit);
    if (exact >= 0)
      FUZZ_CHECK(exact == *bytes, "'%s' is %llu bytes, not %llu", text.c_str(),
                 static_cast<unsigned long long>(*bytes), static_cast<unsigned long long>(exact));
  } else {
    bool fraction = false;
    std::string unit;
    if (size_shape(text, &fraction, &unit) && !(fraction && (unit.empty() || unit == "B"))) {
      const __int128 exact = exact_bytes(text, unit);
      FUZZ_CHECK(exact < 0 || exact >= 18000000000000000000ull, "'%s' (%llu bytes) is refused",
                 text.c_str(), static_cast<unsigned long long>(exact));
    }
  }

  const auto spec = spillway::parse_size_or_percent(text);
  if (!text.empty() && text.back() == '%') {
    if (spec) {
      FUZZ_CHECK(spec->set && spec->fraction > 0 && spec->fraction <= 1,
                 "'%s' gives the fraction %g", text.c_str(), spec->fraction);
      FUZZ_CHECK(spec->resolve(UINT64_C(1) << 40) <= UINT64_C(1) << 40, "'%s' resolves above 1",
                 text.c_str());
    }
  } else {
    // Without '%' it is parse_bytes exactly.
    FUZZ_CHECK(spec.has_value() == bytes.has_value(), "'%s': the two parsers disagree",
               text.c_str());
    if (spec)
      FUZZ_CHECK(spec->fraction == 0 && spec->bytes == *bytes && spec->resolve(12345) == *bytes,
                 "'%s': the two parsers disagree on the value", text.c_str());
  }
  return 0;
}
