#include "size.h"

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
  double v = 0;
  const size_t used = decimal_prefix(text, &v);
  if (used == 0 || !std::isfinite(v)) return std::nullopt;
  std::string unit = text.substr(used);
  static constexpr std::pair<const char*, double> kUnits[] = {{"", 1},
                                                              {"B", 1},
                                                              {"KiB", 1024.0},
                                                              {"MiB", 1048576.0},
                                                              {"GiB", 1073741824.0},
                                                              {"TiB", 1099511627776.0},
                                                              {"KB", 1e3},
                                                              {"MB", 1e6},
                                                              {"GB", 1e9},
                                                              {"TB", 1e12}};
  for (const auto& [name, mult] : kUnits) {
    if (unit == name) {
      double bytes = std::floor(v * mult);
      if (bytes >= 1.8e19) return std::nullopt;
      if (unit.empty() || unit == "B") {
        if (v != std::floor(v)) return std::nullopt;  // fractional bytes
      }
      return static_cast<uint64_t>(bytes);
    }
  }
  return std::nullopt;
}

std::optional<SizeSpec> parse_size_or_percent(const std::string& text) {
  SizeSpec s;
  s.set = true;
  if (!text.empty() && text.back() == '%') {
    std::string num = text.substr(0, text.size() - 1);
    double pct = 0;
    if (decimal_prefix(num, &pct) != num.size() || !(pct > 0) || pct > 100) return std::nullopt;
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
