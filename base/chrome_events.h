// A Chrome trace file in the JSON Array Format (which Perfetto and
// chrome://tracing open), written the one way both of spillway's trace
// writers write it: the shim's SPILLWAY_TRACE (observe/chrome_trace.h) and
// spillway-replay's --trace-out. '[' then one event per line, each after the
// first starting with ','; lines go out whole, so a file cut at any write
// (a SIGKILL, a crash) loads up to it: the format allows the closing ']' to
// be missing. Timestamps are microseconds with three decimals.
//
// Bounded: events are formatted into a buffer of fixed size that goes out
// when full. Not thread-safe: its owner serializes the calls.
#pragma once

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace spillway {

class ChromeEventWriter {
 public:
  // An event's JSON object is cut beyond this (formats bound their strings
  // well below it).
  static constexpr size_t kMaxEvent = 2048;

  // Writes into `fd`, which it owns from now on (closed by close() or the
  // destructor); `buffer_bytes` is raised to room for two events at least.
  ChromeEventWriter(int fd, size_t buffer_bytes);
  // Closes the file as it is, without the closing ']' (a fork's copy of the
  // owner, or an owner that never finished: the format allows it).
  ~ChromeEventWriter();
  ChromeEventWriter(const ChromeEventWriter&) = delete;
  ChromeEventWriter& operator=(const ChromeEventWriter&) = delete;

  // One event: `fmt` and its arguments format the event's JSON object.
  void event(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  void vevent(const char* fmt, va_list ap);
  // The metadata events that name a process's and a thread's track and
  // order the threads (names escaped).
  void process_name(uint32_t pid, std::string_view name);
  void thread_name(uint32_t pid, uint64_t tid, std::string_view name);
  void thread_sort_index(uint32_t pid, uint64_t tid, int index);

  // What is buffered out, in one write. A failed write (a full disk) ends
  // the file there: later events are dropped, and close() says false.
  void flush();
  // The closing ']' after the last event, everything out, the file closed.
  // True if every write succeeded. Later events are dropped.
  bool close();
  bool closed() const { return closed_; }
  int error() const { return err_; }  // errno of the failed write or close (0: none)

  size_t buffered_peak() const { return peak_; }
  size_t buffer_bytes() const { return cap_; }
  uint64_t bytes_written() const { return written_; }

  // `ns` as the format's microseconds with three decimals ("1234.567").
  static std::string micros(uint64_t ns);

 private:
  void append(const char* p, size_t n);

  int fd_;
  const size_t cap_;
  std::unique_ptr<char[]> buf_;
  size_t len_ = 0, peak_ = 0;
  uint64_t written_ = 0;
  int err_ = 0;
  bool first_ = true, failed_ = false, closed_ = false;
};

}  // namespace spillway
