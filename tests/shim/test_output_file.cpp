// open_output (base/output_file.h): how every file spillway writes for the
// user is opened, and the words each refusal uses.
#include "output_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace fs = std::filesystem;

namespace spillway {
namespace {

class OutputFile : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string t = (fs::temp_directory_path() / "spillway-out-XXXXXX").string();
    ASSERT_NE(mkdtemp(t.data()), nullptr);
    dir_ = t;
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::string read(const fs::path& p) {
    std::ifstream f(p);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  static void write_fd(int fd, const std::string& text) {
    ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    ::close(fd);
  }

  fs::path dir_;
};

TEST_F(OutputFile, ANewFileIsCreated0644AndAnOldOneTruncated) {
  const fs::path p = dir_ / "stats.json";
  const mode_t old = ::umask(022);
  std::string why;
  int fd = open_output(p.string(), &why);
  ::umask(old);
  ASSERT_GE(fd, 0) << why;
  write_fd(fd, "a longer first text");
  struct stat st {};
  ASSERT_EQ(::stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  fd = open_output(p.string(), &why);
  ASSERT_GE(fd, 0) << why;
  write_fd(fd, "second");
  EXPECT_EQ(read(p), "second");
}

TEST_F(OutputFile, AppendKeepsWhatIsThere) {
  const fs::path p = dir_ / "spillway.log";
  std::ofstream(p) << "one\n";
  std::string why;
  const int fd = open_output(p.string(), &why, /*append=*/true);
  ASSERT_GE(fd, 0) << why;
  write_fd(fd, "two\n");
  EXPECT_EQ(read(p), "one\ntwo\n");
}

TEST_F(OutputFile, AMissingDirectoryIsNamed) {
  const fs::path p = dir_ / "no-such-dir" / "trace.json";
  std::string why;
  EXPECT_EQ(open_output(p.string(), &why), -1);
  EXPECT_EQ(why, "its directory '" + (dir_ / "no-such-dir").string() + "' does not exist");
  EXPECT_FALSE(fs::exists(dir_ / "no-such-dir"));
}

TEST_F(OutputFile, ADirectoryAnEmptyPathAndAFileAsDirectoryAreRefused) {
  std::string why;
  EXPECT_EQ(open_output(dir_.string(), &why), -1);
  EXPECT_EQ(why, "it is a directory");
  EXPECT_EQ(open_output("", &why), -1);
  EXPECT_EQ(why, "the path is empty");
  std::ofstream(dir_ / "file") << "x";
  EXPECT_EQ(open_output((dir_ / "file" / "stats.json").string(), &why), -1);
  EXPECT_EQ(why, "cannot create it: Not a directory");
  EXPECT_EQ(read(dir_ / "file"), "x");
}

TEST_F(OutputFile, AFifoWithoutAReaderIsRefusedNotWaitedFor) {
  const fs::path p = dir_ / "fifo";
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  std::string why;
  EXPECT_EQ(open_output(p.string(), &why), -1);
  EXPECT_EQ(why, "it is a FIFO with no reader");
  // (A blocking open would never return: this test would hang, not fail.)
}

TEST_F(OutputFile, ADeviceIsWrittenAsItIs) {
  std::string why;
  const int fd = open_output("/dev/null", &why);
  ASSERT_GE(fd, 0) << why;
  write_fd(fd, "gone");
}

TEST_F(OutputFile, TheJobsOwnSymbolicLinkIsFollowed) {
  const fs::path target = dir_ / "real.json";
  std::ofstream(target) << "old contents";
  fs::create_symlink(target, dir_ / "link.json");
  std::string why;
  const int fd = open_output((dir_ / "link.json").string(), &why);
  ASSERT_GE(fd, 0) << why;
  write_fd(fd, "new");
  EXPECT_EQ(read(target), "new");
  EXPECT_TRUE(fs::is_symlink(dir_ / "link.json"));
}

TEST_F(OutputFile, AnotherUsersSymbolicLinkIsNeverFollowed) {
  // As in a shared /tmp: another user's link to a file of the job's user.
  const fs::path target = dir_ / "precious.txt";
  std::ofstream(target) << "keep me";
  const fs::path link = dir_ / "trace.json";
  fs::create_symlink(target, link);
  constexpr uid_t kOther = 4242;
  if (::lchown(link.c_str(), kOther, kOther) != 0)
    GTEST_SKIP() << "cannot give the link to another user here (needs root): " << strerror(errno);
  std::string why;
  EXPECT_EQ(open_output(link.string(), &why), -1);
  EXPECT_EQ(why,
            "it is a symbolic link of another user (uid 4242): spillway does not write through "
            "it, as it could lead into a file of yours");
  EXPECT_EQ(read(target), "keep me");
  // Appending (a log file) is refused alike.
  EXPECT_EQ(open_output(link.string(), &why, /*append=*/true), -1);
  EXPECT_EQ(read(target), "keep me");
}

}  // namespace
}  // namespace spillway
