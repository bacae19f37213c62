#include "chrome_events.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "json.h"
#include "output_file.h"

namespace spillway {

ChromeEventWriter::ChromeEventWriter(int fd, size_t buffer_bytes)
    : fd_(fd), cap_(std::max(buffer_bytes, 2 * (kMaxEvent + 2))), buf_(new char[cap_]) {
  append("[", 1);
}

ChromeEventWriter::~ChromeEventWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void ChromeEventWriter::event(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vevent(fmt, ap);
  va_end(ap);
}

void ChromeEventWriter::vevent(const char* fmt, va_list ap) {
  if (closed_) return;
  char one[kMaxEvent];
  const int n = std::vsnprintf(one, sizeof one, fmt, ap);
  if (n < 0) return;
  const size_t len = std::min(static_cast<size_t>(n), sizeof one - 1);
  if (len_ + len + 2 > cap_) flush();  // ',' or nothing before it, '\n' after
  if (!first_) append(",", 1);
  first_ = false;
  append(one, len);
  append("\n", 1);
}

void ChromeEventWriter::process_name(uint32_t pid, std::string_view name) {
  event("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%u,\"args\":{\"name\":\"%s\"}}", pid,
        json_escape(name, 256).c_str());
}

void ChromeEventWriter::thread_name(uint32_t pid, uint64_t tid, std::string_view name) {
  event("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":%" PRIu64
        ",\"args\":{\"name\":\"%s\"}}",
        pid, tid, json_escape(name, 256).c_str());
}

void ChromeEventWriter::thread_sort_index(uint32_t pid, uint64_t tid, int index) {
  event("{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%u,\"tid\":%" PRIu64
        ",\"args\":{\"sort_index\":%d}}",
        pid, tid, index);
}

void ChromeEventWriter::append(const char* p, size_t n) {
  std::memcpy(buf_.get() + len_, p, n);
  len_ += n;
  peak_ = std::max(peak_, len_);
}

void ChromeEventWriter::flush() {
  if (len_ == 0) return;
  // Whole lines only, in one write: a cut file ends at a line boundary
  // unless the process dies inside this very call.
  if (fd_ >= 0 && !failed_) {
    if (write_all(fd_, buf_.get(), len_)) {
      written_ += len_;
    } else {
      failed_ = true;  // a full disk ends the trace, not the job
      err_ = errno;
      ::close(fd_);
      fd_ = -1;
    }
  }
  len_ = 0;
}

bool ChromeEventWriter::close() {
  if (closed_) return !failed_;
  if (len_ + 2 > cap_) flush();
  append("]\n", 2);
  flush();
  closed_ = true;
  if (fd_ >= 0 && ::close(fd_) != 0) {
    failed_ = true;
    err_ = errno;
  }
  fd_ = -1;
  return !failed_;
}

std::string ChromeEventWriter::micros(uint64_t ns) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%" PRIu64 ".%03u", ns / 1000, static_cast<unsigned>(ns % 1000));
  return buf;
}

}  // namespace spillway
