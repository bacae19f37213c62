#include "output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace spillway {
namespace {

std::string dir_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string why_not(const std::string& path, int err) {
  if (err == ENOENT) {
    struct stat st {};
    const std::string dir = dir_of(path);
    if (::stat(dir.c_str(), &st) != 0) return "its directory '" + dir + "' does not exist";
  }
  if (err == ENXIO) return "it is a FIFO with no reader";
  if (err == EISDIR) return "it is a directory";
  return std::string("cannot create it: ") + std::strerror(err);
}

}  // namespace

int open_output(const std::string& path, std::string* why, bool append) {
  if (path.empty()) {
    *why = "the path is empty";
    return -1;
  }
  // O_NONBLOCK: opening a FIFO for writing would otherwise wait for a
  // reader forever (ENXIO instead); cleared once open.
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK | (append ? O_APPEND : 0);
  int fd = ::open(path.c_str(), flags | O_NOFOLLOW, 0644);
  if (fd < 0 && errno == ELOOP) {
    struct stat link {};
    if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode) && link.st_uid != ::geteuid() &&
        link.st_uid != 0) {
      *why = "it is a symbolic link of another user (uid " + std::to_string(link.st_uid) +
             "): spillway does not write through it, as it could lead into a file of yours";
      return -1;
    }
    fd = ::open(path.c_str(), flags, 0644);
  }
  if (fd < 0) {
    *why = why_not(path, errno);
    return -1;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    *why = std::string("cannot stat it: ") + std::strerror(errno);
    ::close(fd);
    return -1;
  }
  // Truncated only now, and only a regular file: a device (/dev/null) or a
  // pipe is written as it is.
  if (!append && S_ISREG(st.st_mode) && st.st_size > 0 && ::ftruncate(fd, 0) != 0) {
    *why = std::string("cannot truncate it: ") + std::strerror(errno);
    ::close(fd);
    return -1;
  }
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    *why = std::string("cannot make it blocking: ") + std::strerror(errno);
    ::close(fd);
    return -1;
  }
  return fd;
}

bool write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace spillway
