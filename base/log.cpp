#include "log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <memory>

namespace spillway::log {
namespace {

std::shared_ptr<spdlog::logger>& logger() {
  // Not registered in spdlog's global registry: the host process may use
  // spdlog too, and names must not collide.
  static auto l = std::make_shared<spdlog::logger>(
      "spillway", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  return l;
}

spdlog::level::level_enum to_spdlog(LogLevel l) {
  switch (l) {
    case LogLevel::kTrace:
      return spdlog::level::trace;
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarn:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
    case LogLevel::kOff:
      return spdlog::level::off;
  }
  return spdlog::level::info;
}

}  // namespace

bool init(LogLevel level, const std::string& file, std::string* why, const std::string& who) {
  auto& l = logger();
  bool ok = true;
  if (!file.empty()) {
    try {
      auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(file, false);
      l = std::make_shared<spdlog::logger>("spillway", sink);
    } catch (const spdlog::spdlog_ex& e) {
      ok = false;
      if (why) *why = e.what();
    }
  }
  // `who` is copied into the pattern: spdlog reads '%' there as a flag.
  std::string tag;
  for (char c : who) tag += c == '%' ? std::string("%%") : std::string(1, c);
  l->set_pattern(tag.empty() ? "[spillway %L] %v" : "[spillway %L " + tag + "] %v");
  l->set_level(to_spdlog(level));
  l->flush_on(spdlog::level::warn);
  return ok;
}

spdlog::logger& get() {
  return *logger();
}

}  // namespace spillway::log
