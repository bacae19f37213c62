#include "log.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <unistd.h>

#include <memory>
#include <mutex>

#include "output_file.h"

namespace spillway::log {
namespace {

std::shared_ptr<spdlog::logger>& logger() {
  // Not registered in spdlog's global registry: the host process may use
  // spdlog too, and names must not collide.
  static auto l = std::make_shared<spdlog::logger>(
      "spillway", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  return l;
}

// SPILLWAY_LOG_FILE, on a descriptor open_output() opened (spdlog's file
// sinks open the path themselves, following any symbolic link).
class FdSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit FdSink(int fd) : fd_(fd) {}
  ~FdSink() override { ::close(fd_); }
  FdSink(const FdSink&) = delete;
  FdSink& operator=(const FdSink&) = delete;

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    (void)write_all(fd_, buf.data(), buf.size());  // a full disk loses log lines, not the job
  }
  void flush_() override {}  // write() leaves nothing buffered here

 private:
  int fd_;
};

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
      std::string whynot;
      const int fd = open_output(file, &whynot, /*append=*/true);
      if (fd < 0) {
        ok = false;
        if (why) *why = whynot;
      } else {
        l = std::make_shared<spdlog::logger>("spillway", std::make_shared<FdSink>(fd));
      }
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
