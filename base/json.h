// One escape for the JSON spillway writes by hand (the Chrome trace, the
// replayer's report): a string body with quotes and backslashes escaped and
// control characters as \u00XX, so that any name, path or message stays
// valid JSON. Other bytes pass unchanged (names are UTF-8).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace spillway {

// At most `max` bytes of `s` are escaped (names are cut, not the output).
std::string json_escape(std::string_view s, size_t max = std::string_view::npos);

}  // namespace spillway
