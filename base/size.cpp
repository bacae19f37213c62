#include "size.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <utility>

namespace spillway {

size_t decimal_prefix(const std::string& text, double* value) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == 0) return 0;
  if (i < text.size() && text[i] == '.') {
    size_t j = i + 1;
    while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
    if (j == i + 1) return 0;
    i = j;
  }
  *value = std::strtod(text.substr(0, i).c_str(), nullptr);
  return i;
}

std::optional<uint64_t> parse_bytes(const std::string& text) {
  double unused = 0;
  const size_t used = decimal_prefix(text, &unused);
  if (used == 0) return std::nullopt;
  const std::string unit = text.substr(used);
  static constexpr std::pair<const char*, uint64_t> kUnits[] = {{"", 1},
                                                                {"B", 1},
                                                                {"KiB", uint64_t{1} << 10},
                                                                {"MiB", uint64_t{1} << 20},
                                                                {"GiB", uint64_t{1} << 30},
                                                                {"TiB", uint64_t{1} << 40},
                                                                {"KB", 1000},
                                                                {"MB", 1000000},
                                                                {"GB", 1000000000},
                                                                {"TB", 1000000000000}};
  constexpr uint64_t kLimit = 18000000000000000000u;  // 1.8e19, just under 2^64
  for (const auto& [name, mult] : kUnits) {
    if (unit != name) continue;
    // In integers: through a double, 1.001KB was 1000 bytes, 70.0000009107TB
    // one byte short (docs/config.md: rounded down, from the exact value).
    const size_t dot = std::min(text.find('.'), used);
    uint64_t whole = 0;
    for (size_t i = 0; i < dot; ++i) {
      if (whole > (UINT64_MAX - 9) / 10) return std::nullopt;  // 1.8e19 and more
      whole = whole * 10 + static_cast<uint64_t>(text[i] - '0');
    }
    // The fraction times the unit, digit by digit from the last: what is
    // carried out of the first is floor(fraction * mult), below mult.
    uint64_t carry = 0;
    bool fractional = false;
    for (size_t i = used; i > dot + 1; --i) {
      const auto d = static_cast<uint64_t>(text[i - 1] - '0');
      fractional = fractional || d != 0;
      carry = (d * mult + carry) / 10;
    }
    if (mult == 1 && fractional) return std::nullopt;  // fractional bytes
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(whole, mult, &bytes) || bytes + carry < bytes ||
        bytes + carry >= kLimit)
      return std::nullopt;
    return bytes + carry;
  }
  return std::nullopt;
}

std::optional<SizeSpec> parse_size_or_percent(const std::string& text) {
  SizeSpec s;
  s.set = true;
  if (!text.empty() && text.back() == '%') {
    std::string num = text.substr(0, text.size() - 1);
    double pct = 0;
    // At least 0.0001%: a smaller share of a device (1e-25% was fuzzed)
    // resolves to 0 bytes, which a budget would take for "no budget".
    if (decimal_prefix(num, &pct) != num.size() || !(pct >= kMinPercent) || pct > 100)
      return std::nullopt;
    s.fraction = pct / 100.0;
    return s;
  }
  auto b = parse_bytes(text);
  if (!b) return std::nullopt;
  s.bytes = *b;
  return s;
}

std::string format_bytes(uint64_t bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  size_t u = 0;
  while (v >= 1024 && u + 1 < std::size(units)) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

}  // namespace spillway
