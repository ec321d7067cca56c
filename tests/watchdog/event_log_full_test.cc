// events.jsonl keeps the job's history when worker logs fill the disk: the
// file is created with room reserved (watchdog/event_log.h), so a disk
// filled after it was opened still takes its lines. A 256 KiB tmpfs mounted
// for the test; needs root to mount, otherwise skipped.
#include <doctest/doctest.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "base/scoped_fd.h"
#include "tests/common/skip.h"
#include "tests/watchdog/test_util.h"
#include "watchdog/event_log.h"

namespace wd = ddprun::watchdog;
using wd::testing::TempDir;

TEST_CASE("event log: a disk filled after it was opened still takes some 250 events") {
  TempDir dir;
  const std::string disk = dir.path() + "/disk";
  std::filesystem::create_directories(disk);
  if (::mount("tmpfs", disk.c_str(), "tmpfs", 0, "size=256k") != 0)
    SKIP_TEST(std::string("cannot mount a tmpfs: ") + strerror(errno));
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{disk};

  wd::EventLog log(disk + "/events.jsonl");
  // Another file takes every page left, as worker logs do.
  {
    ddprun::base::ScopedFd fill(::open((disk + "/stdout.log").c_str(),
                                       O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    REQUIRE(fill.get() >= 0);
    const std::string block(4096, 'x');
    while (::write(fill.get(), block.data(), block.size()) > 0) {
    }
    CHECK(errno == ENOSPC);
  }
  constexpr int kEvents = 200;  // of ~250 bytes: under the 64 KiB reserved
  for (int i = 0; i < kEvents; ++i)
    log.write("log_write_failed", 0, {i % 2}, "rank " + std::to_string(i) + ": No space left on device",
              {{"path", disk + "/attempt_0/" + std::to_string(i % 2) + "/stdout.log"}});
  REQUIRE(log.flush(std::chrono::steady_clock::now() + std::chrono::seconds(30)));
  std::ifstream in(disk + "/events.jsonl");
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines)
    CHECK(nlohmann::json::parse(line)["event"] == "log_write_failed");
  CHECK(lines == kEvents);
}
