// Opening the files spillway writes for the user (SPILLWAY_STATS,
// SPILLWAY_TRACE, SPILLWAY_RECORD, the replayer's outputs), one way for all
// of them, so that each refuses the same bad paths with the same words
// (docs/config.md, "Output files"):
//
// - a missing directory or a path that cannot be written: named, with why;
// - a symbolic link owned by another user (neither the job's user nor
//   root) is never followed: in a shared, sticky directory such as /tmp
//   another user can leave one pointing at a file of the job's user, which
//   opening it would truncate (the attack the kernel's protected_symlinks
//   setting closes, where it is on). The job's own links, and root's
//   (/dev/stderr), are followed;
// - a FIFO without a reader is refused rather than waited for, and only a
//   regular file is truncated (a device or a pipe is written as it is);
// - a file created is 0644, less the process's umask.
#pragma once

#include <cstddef>
#include <string>

namespace spillway {

// A descriptor open for writing (O_CLOEXEC), or -1 and `*why` (which does
// not repeat the path). `append`: written at its end (O_APPEND), not
// truncated (a log file).
int open_output(const std::string& path, std::string* why, bool append = false);

// Writes all `n` bytes (retrying short writes and EINTR); false on an error,
// with errno set.
bool write_all(int fd, const char* p, size_t n);

}  // namespace spillway
