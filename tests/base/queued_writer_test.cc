// base/queued_writer.h on real files with a real stall: a FIFO nobody
// reads takes 64 KiB and then blocks its writer, as a stalled NFS folder
// does. The test thread keeps writing through it (it would hang here if a
// write waited for the file), the bound holds, order is kept, the notice
// marks the gap once the reader drains it, and close() with a deadline
// returns while the writer is still stuck. Waits are polls on what the
// files and the writer show, each with a deadline; no sleep synchronizes.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/procfs.h"
#include "base/queued_writer.h"
#include "base/safe_file.h"
#include "tests/common/skip.h"
#include "tests/common/temp_dir.h"
#include "tests/common/thread_count.h"

using ddprun::base::QueuedFile;
using ddprun::base::QueuedWriter;
using ddprun::base::ScopedFd;
using ddprun::testing::TempDir;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

// Polls `done` until it holds or 30 s pass (a busy machine is slow, never this slow).
bool eventually(const std::function<bool()>& done) {
  const auto deadline = Clock::now() + 30s;
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

// A FIFO with a reader that reads nothing yet: its writer end blocks once
// the pipe holds 64 KiB.
struct StalledFifo {
  explicit StalledFifo(const std::string& path) {
    REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
    reader.reset(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    REQUIRE(reader.valid());
    ScopedFd w(::open(path.c_str(), O_WRONLY | O_CLOEXEC));  // blocking, as a file is
    REQUIRE(w.valid());
    writer = std::move(w);
  }
  // Reads until `text` holds `until` (or 30 s pass); what was read is kept.
  bool read_until(const std::string& until) {
    const auto deadline = Clock::now() + 30s;
    char buf[65536];
    while (text.find(until) == std::string::npos) {
      if (Clock::now() > deadline) return false;
      pollfd p{reader.get(), POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = ::read(reader.get(), buf, sizeof buf);
      if (n > 0) text.append(buf, static_cast<size_t>(n));
      if (n == 0) return false;  // the writer closed
    }
    return true;
  }
  ScopedFd reader, writer;
  std::string text;
};

std::string line(int i) { return "line " + std::to_string(i) + "\n"; }

}  // namespace

TEST_CASE("a FIFO nobody reads: writes return, the bound holds, order and the drop notice") {
  TempDir dir;
  StalledFifo fifo(dir.file("stalled.log"));
  QueuedWriter::Options o;
  o.max_queued = 256 << 10;
  QueuedWriter writer(o);
  QueuedFile f = writer.add(std::move(fifo.writer), "stalled.log");
  // 2 MiB through a file that takes 64 KiB: every write returns (a write
  // that waited for the file would hang the test here).
  int n = 0;
  size_t sent = 0, most_queued = 0;
  while (sent < (2u << 20)) {
    const std::string l = line(n++);
    f.write(l);
    sent += l.size();
    most_queued = std::max(most_queued, f.queued());
  }
  CHECK(most_queued <= o.max_queued);
  CHECK(f.written() < sent);
  CHECK(f.dropped() > 0);
  CHECK(f.dropped() + f.queued() + f.written() == sent);
  const size_t dropped = f.dropped();
  // The reader catches up: what was queued, in order, then the notice.
  const std::string notice = QueuedWriter::drop_notice(dropped, "stalled.log");
  REQUIRE(fifo.read_until(notice));
  const std::string before = fifo.text.substr(0, fifo.text.find(notice));
  std::string expected;
  for (int i = 0; expected.size() < before.size(); ++i) expected += line(i);
  CHECK(before == expected);
  CHECK(f.written() == before.size() + notice.size());
  // Queued again after the gap, after the notice.
  f.write("after the gap\n");
  REQUIRE(fifo.read_until("after the gap\n"));
  CHECK(fifo.text == expected + notice + "after the gap\n");
  CHECK(writer.close(Clock::now() + 30s).empty());
}

TEST_CASE("close with a deadline returns while the writer is stuck, naming what was left") {
  TempDir dir;
  StalledFifo fifo(dir.file("stuck.log"));
  QueuedWriter writer;
  QueuedFile f = writer.add(std::move(fifo.writer), "stuck.log");
  const std::string chunk(200 << 10, 'x');  // more than the pipe holds
  f.write(chunk);
  REQUIRE(eventually([&] { return f.written() == 0 && f.queued() == chunk.size(); }));
  const std::string left = writer.close(Clock::now() + 200ms);
  CHECK(left.find("bytes for stuck.log") != std::string::npos);
  CHECK(left.find("not written") != std::string::npos);
  f.write("later\n");  // after close: dropped, never waits
  CHECK(f.dropped() == 6);
  // The reader unblocks the abandoned thread, which then leaves (all of
  // it read: a reader closing early would SIGPIPE the process).
  REQUIRE(fifo.read_until(chunk));
}

TEST_CASE("whole-file jobs run in order off the caller's thread; a failing one is reported") {
  TempDir dir;
  std::mutex mu;
  std::vector<std::string> errors;
  QueuedWriter::Options o;
  o.on_error = [&](const std::string& e) {
    std::lock_guard<std::mutex> lk(mu);
    errors.push_back(e);
  };
  QueuedWriter writer(o);
  const auto folder = std::make_shared<ddprun::base::SafeDir>(ddprun::base::SafeDir::open(dir.path()));
  for (int i = 0; i < 5; ++i) {
    CHECK(writer.run("report.json", 10, [folder, i] {
      folder->write_atomically("report.json", "version " + std::to_string(i) + "\n", false);
    }));
  }
  CHECK(writer.run("nowhere/x.json", 1, [folder] { folder->write_atomically("nowhere/x.json", "x", false); }));
  REQUIRE(writer.flush(Clock::now() + 30s));
  std::ifstream in(dir.file("report.json"));
  std::stringstream s;
  s << in.rdbuf();
  CHECK(s.str() == "version 4\n");
  std::lock_guard<std::mutex> lk(mu);
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].find("cannot write nowhere/x.json") == 0);
}

TEST_CASE("a file that fails says why and takes nothing more; a released one is closed") {
  QueuedWriter writer;
  {
    QueuedFile full = writer.add(ScopedFd(::open("/dev/full", O_WRONLY | O_CLOEXEC)), "/dev/full");
    REQUIRE(full.valid());
    full.write("lost\n");
    REQUIRE(eventually([&] { return full.error() != 0; }));
    CHECK(full.error() == ENOSPC);
    CHECK(full.take_unwritten() == "lost\n");  // for the owner to show elsewhere
    CHECK(full.take_unwritten().empty());       // once
    full.write("more\n");
    CHECK(full.queued() == 0);
  }
  int fds[2];
  REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
  ScopedFd read_end(fds[0]);
  {
    QueuedFile f = writer.add(ScopedFd(fds[1]), "pipe");
    f.write("last words\n");
  }  // released: written, then closed by the writer's thread
  std::string got;
  char buf[256];
  for (;;) {
    pollfd p{read_end.get(), POLLIN, 0};
    REQUIRE(::poll(&p, 1, 30000) == 1);
    const ssize_t n = ::read(read_end.get(), buf, sizeof buf);
    REQUIRE(n >= 0);
    if (n == 0) break;  // EOF: the descriptor was closed
    got.append(buf, static_cast<size_t>(n));
  }
  CHECK(got == "last words\n");
}

namespace {

using ddprun::testing::thread_count;

// In a forked child, where no thread of another case can come or go: 0 when
// the writer made no thread until its first file, and one while it had it.
int thread_steps(const std::string& dir) {
  if (thread_count() != 1) return 1;
  {
    QueuedWriter unused;
    if (thread_count() != 1) return 2;  // no thread until a file or a job comes
    if (!unused.close(Clock::now() + 5s).empty()) return 3;
    // Closed: a later file takes nothing, and no thread starts for it.
    QueuedFile late =
        unused.add(ddprun::base::SafeDir::open(dir).open_truncate("late.log"), "late.log");
    late.write("dropped\n");
    if (thread_count() != 1) return 4;
  }
  QueuedWriter w;
  QueuedFile f = w.add(ddprun::base::SafeDir::open(dir).open_truncate("a.log"), "a.log");
  if (thread_count() != 2) return 5;
  f.write("one\n");
  if (!w.close(Clock::now() + 30s).empty()) return 6;
  if (thread_count() != 1) return 7;  // joined
  return 0;
}

}  // namespace

TEST_CASE("the writer thread starts with the first file; one never given a file closes at once") {
#ifdef __SANITIZE_THREAD__
  // ThreadSanitizer's runtime runs threads of its own and refuses new ones
  // after a multi-threaded fork: counting threads means nothing there.
  SKIP_TEST("thread counts under ThreadSanitizer (its own threads)");
#endif
  TempDir dir;
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) _exit(thread_steps(dir.path()));
  int status = 0;
  // Bounded by the child's own deadlines (5 s and 30 s closes).
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);  // else: the step of thread_steps that failed
  std::ifstream in(dir.path() + "/a.log");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  CHECK(text == "one\n");
  CHECK_FALSE(std::ifstream(dir.path() + "/late.log").get() != EOF);  // nothing in it
}
