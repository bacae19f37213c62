// Logging through spdlog, compiled into the shim with hidden visibility so
// nothing clashes with a host process that has its own spdlog or fmt.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace spillway {
enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kOff };
}  // namespace spillway

namespace spillway::log {

// Sets the level and sink (`file`, or stderr when empty). Returns false and a
// reason if the file cannot be opened (logging then goes to stderr).
bool init(LogLevel level, const std::string& file, std::string* why);
spdlog::logger& get();

template <class... A>
void info(spdlog::format_string_t<A...> f, A&&... a) {
  get().info(f, std::forward<A>(a)...);
}
template <class... A>
void warn(spdlog::format_string_t<A...> f, A&&... a) {
  get().warn(f, std::forward<A>(a)...);
}
template <class... A>
void error(spdlog::format_string_t<A...> f, A&&... a) {
  get().error(f, std::forward<A>(a)...);
}
template <class... A>
void debug(spdlog::format_string_t<A...> f, A&&... a) {
  get().debug(f, std::forward<A>(a)...);
}

}  // namespace spillway::log
