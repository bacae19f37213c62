// Logging through spdlog, compiled into the shim with hidden visibility so
// nothing clashes with a host process that has its own spdlog or fmt.
#pragma once

#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdint>
#include <string>

namespace spillway {
enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kOff };
}  // namespace spillway

namespace spillway::log {

// Sets the level and sink (`file`, or stderr when empty). Returns false and a
// reason if the file cannot be opened (logging then goes to stderr). `who`,
// if not empty, follows the level letter in every line ("rank 3 pid 1234":
// the ranks of a job write into one terminal).
bool init(LogLevel level, const std::string& file, std::string* why, const std::string& who = {});
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

// One warning site that may fire again and again (a full host budget at
// every allocation, say): logged the 1st, 2nd, 4th, 8th... time, each line
// after the first saying how often it has occurred, so that a log is never
// flooded and the count is never lost.
class Repeats {
 public:
  // The number of this occurrence if it is to be logged, else 0.
  uint64_t next() {
    const uint64_t n = n_.fetch_add(1, std::memory_order_relaxed) + 1;
    return (n & (n - 1)) == 0 ? n : 0;
  }

 private:
  std::atomic<uint64_t> n_{0};
};

template <class... A>
void log_repeated(spdlog::level::level_enum level, Repeats& r, spdlog::format_string_t<A...> f,
                  A&&... a) {
  const uint64_t n = r.next();
  if (n == 1) get().log(level, f, std::forward<A>(a)...);
  if (n > 1)
    get().log(level, "{} (seen {} times; repeats are logged at powers of two)",
              fmt::format(f, std::forward<A>(a)...), n);
}
template <class... A>
void warn_repeated(Repeats& r, spdlog::format_string_t<A...> f, A&&... a) {
  log_repeated(spdlog::level::warn, r, f, std::forward<A>(a)...);
}
template <class... A>
void error_repeated(Repeats& r, spdlog::format_string_t<A...> f, A&&... a) {
  log_repeated(spdlog::level::err, r, f, std::forward<A>(a)...);
}

}  // namespace spillway::log
