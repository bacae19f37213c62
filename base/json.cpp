#include "json.h"

#include <cstdio>

namespace spillway {

std::string json_escape(std::string_view s, size_t max) {
  std::string out;
  const size_t n = s.size() < max ? s.size() : max;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace spillway
