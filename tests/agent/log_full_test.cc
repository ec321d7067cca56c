// A log file that cannot be written (a full disk: a 256 KiB tmpfs mounted
// for the test) is one warning naming it, its output stays on the console,
// the event log records it and the final summary repeats it. Needs root to
// mount; otherwise exits 77 (ctest: skipped).
#include <doctest/doctest.h>
#include <errno.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/agent/ddprun_process.h"
#include "tests/common/temp_dir.h"

using namespace ddprun::testing;
namespace fs = std::filesystem;

namespace {

class Tmpfs {
 public:
  Tmpfs(const std::string& path, const char* options) : path_(path) {
    fs::create_directories(path);
    mounted_ = mount("tmpfs", path.c_str(), "tmpfs", 0, options) == 0;
    error_ = mounted_ ? 0 : errno;
  }
  ~Tmpfs() {
    if (mounted_) umount2(path_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  int error() const { return error_; }

 private:
  std::string path_;
  bool mounted_ = false;
  int error_ = 0;
};

std::string find_file(const std::string& root, const std::string& name) {
  for (auto& e : fs::recursive_directory_iterator(root))
    if (e.path().filename() == name) {
      std::ifstream in(e.path());
      std::stringstream s;
      s << in.rdbuf();
      return s.str();
    }
  return "";
}

}  // namespace

TEST_CASE("a full disk under --log-dir: one warning per file, console keeps it all, event and summary") {
  TempDir dir;
  std::string logs = dir.path() + "/logs";
  Tmpfs tmpfs(logs, "size=256k");
  if (!tmpfs.mounted()) {
    std::printf("skipped: cannot mount a tmpfs at %s: %s\n", logs.c_str(), strerror(tmpfs.error()));
    std::fflush(stdout);
    _exit(77);
  }
  constexpr int kLines = 10000;  // of 100 bytes, per rank: 2 MB in all
  auto r = run_ddprun({"--nproc-per-node=2", "--rdzv-id=full", "--log-dir", logs, TEST_WORKER,
                       "bytes", std::to_string(kLines * 100)},
                      {}, Seconds(120));
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.status == 0);
  // The console has every line of both ranks.
  CHECK(lines_with(r.out, "[default0]:0123456789").size() == kLines);
  CHECK(lines_with(r.out, "[default1]:0123456789").size() == kLines);
  // One warning per failed file, naming it and the error.
  size_t warned = count_of(r.err, "cannot write ");
  CHECK(warned >= 1);
  CHECK(warned <= 2);
  CHECK(count_of(r.err, "/stdout.log: No space left on device; its output goes on to the console") ==
        warned);
  // The summary at the end repeats them.
  CHECK(count_of(r.err, "log file(s) could not be written; their output went to the console:") == 1);
  CHECK(count_of(r.err, "/stdout.log: No space left on device\n") == warned);
  // The event log: its room was reserved when it was created, and the
  // worker logs' writer thread may fill the disk before the event log's
  // thread writes its first line (CI, session 16).
  CHECK(count_of(find_file(logs, "events.jsonl"), "\"log_write_failed\"") == warned);
}
