// The console path: a console nobody reads never holds up the agent, --tee
// and --redirects as torchrun's, long lines whole up to the documented size.
// Python workers run with plain `python3` from PATH (no torch needed).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <boost/asio/io_context.hpp>

#include "agent/console.h"
#include "agent/line_splitter.h"
#include "agent/log_sink.h"
#include "base/procfs.h"
#include "tests/agent/ddprun_process.h"
#include "tests/common/skip.h"
#include "tests/common/slurp.h"
#include "tests/common/temp_dir.h"
#include "tests/common/thread_count.h"
#include "tests/common/time_scale.h"

using namespace ddprun::testing;
namespace fs = std::filesystem;

namespace {

const std::string kWorker = std::string(WORKERS_DIR) + "/console_worker.py";

// Every file called `name` below `root`, concatenated.
std::string files_named(const std::string& root, const std::string& name) {
  std::string all;
  for (auto& e : fs::recursive_directory_iterator(root))
    if (e.path().filename() == name) all += slurp(e.path());
  return all;
}

uintmax_t bytes_named(const std::string& root, const std::string& name) {
  uintmax_t n = 0;
  std::error_code ec;
  for (auto& e : fs::recursive_directory_iterator(root, ec))
    if (e.path().filename() == name) n += fs::file_size(e.path(), ec);
  return n;
}

}  // namespace

TEST_CASE("a console nobody reads: SIGTERM still stops the job within --term-timeout + 1 s") {
  TempDir dir;
  DdprunProcess p({"--nproc-per-node=2", "--term-timeout=2", "--log-dir", dir.path(),
                   kWorker, "flood"});
  p.stall_stdout(true);  // the reader stalls for the whole test (< 20 s)
  auto stalled_at = std::chrono::steady_clock::now();
  REQUIRE(p.wait_for_stderr([](const std::string& e) { return count_of(e, "flooding rank=") == 2; },
                            Seconds(20)));
  // The console queue is full once the log files hold about as much as it
  // (1 MiB of prefixed lines, ~0.93 MB raw): from then on the agent
  // throttles the workers. The files are the only progress to watch: poll.
  constexpr uintmax_t kQueueFull = 900'000;
  auto until = std::chrono::steady_clock::now() + Seconds(15);
  while (bytes_named(dir.path(), "stdout.log") < kQueueFull &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(bytes_named(dir.path(), "stdout.log") >= kQueueFull);
  // The log files stop growing: the workers are held by back-pressure.
  p.send(SIGTERM);
  // The requirement: exit within --term-timeout (2 s; the workers ignore
  // SIGTERM) plus 1 s, while the console is still not read.
  bool exited = wait_dead(p.pid(), ddprun::testing::scaled(Seconds(3)));
  CHECK(exited);
  CHECK(std::chrono::steady_clock::now() - stalled_at < Seconds(20));
  p.stall_stdout(false);
  auto r = p.finish(Seconds(20));
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.status == 143);
  CHECK(count_of(r.err, "stopping rank=") == 2);
  CHECK(count_of(r.err, "the console did not take ") == 1);
  CHECK(count_of(r.err, "(the log files under --log-dir have them)") == 1);
  // The files have what the workers wrote from the first line on (a rank
  // descheduled until the SIGTERM may have written nothing).
  size_t files = 0;
  for (auto& e : fs::recursive_directory_iterator(dir.path())) {
    if (e.path().filename() != "stdout.log" || fs::file_size(e.path()) == 0) continue;
    std::string rank = e.path().parent_path().filename().string();
    CHECK(slurp(e.path()).rfind("rank=" + rank + " line=0 ", 0) == 0);
    ++files;
  }
  CHECK(files >= 1);
}

TEST_CASE("ddprun 2>&1 into a reader that stalls: SIGTERM still exits 143 while the reader stalls") {
  // `ddprun ... 2>&1 | (sleep 40; cat)`: ddprun's own lines ("got SIGTERM;
  // stopping the workers") share the stalled pipe with the workers' output.
  // They go through the console's writer too, so logging never blocks the
  // agent, and --log-dir's ddprun.log keeps them. The reader stalls until
  // ddprun has exited, so any exit proves it; the bound is generous (the
  // teardown takes about --term-timeout) because a loaded machine can hold
  // ddprun off the CPU for seconds (it missed a 3 s bound at load ~4,000).
  TempDir dir;
  DdprunProcess p({"--nproc-per-node=2", "--term-timeout=2", "--log-dir", dir.path(), kWorker,
                   "flood"},
                  {}, DDPRUN_BIN, false, /*stderr_to_stdout=*/true);
  p.stall_stdout(true);  // nothing is read until ddprun has exited
  constexpr uintmax_t kQueueFull = 900'000;  // as above: the console queue is full
  auto until = std::chrono::steady_clock::now() + Seconds(20);
  while (bytes_named(dir.path(), "stdout.log") < kQueueFull &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(bytes_named(dir.path(), "stdout.log") >= kQueueFull);
  p.send(SIGTERM);
  CHECK(wait_dead(p.pid(), ddprun::testing::scaled(Seconds(20))));
  p.stall_stdout(false);
  auto r = p.finish(Seconds(20));
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.status == 143);
  const std::string log = files_named(dir.path(), "ddprun.log");
  CHECK(count_of(log, "logs go to ") == 1);
  CHECK(count_of(log, "got SIGTERM; stopping the workers") == 1);
}

TEST_CASE("ddprun's own lines never wait for a full console: past its room they are counted") {
  boost::asio::io_context io;
  auto pipe = ddprun::base::make_pipe();  // its reader never reads
  auto console = std::make_shared<ddprun::agent::Console>(io, pipe.write.get(), false);
  auto sink = std::make_shared<ddprun::agent::LogSink>();
  sink->attach_console(console);
  spdlog::logger logger("test", sink);
  logger.set_pattern("%v");
  // Workers' output up to the high-water mark, then ddprun's lines.
  console->write(&io, std::string(ddprun::agent::Console::kHighWater, 'w'));
  REQUIRE(console->full());
  const std::string line(1000, 'l');
  size_t logged = 0;
  while (sink->lines_not_shown() == 0 && logged < 1000) {
    logger.info("{}", line);
    ++logged;
  }
  // The room past the mark took kLogRoom of them (1001 bytes a line, the
  // writer still holds the whole first batch); the next one was counted.
  CHECK(sink->lines_not_shown() == 1);
  CHECK(logged == ddprun::agent::Console::kLogRoom / 1001 + 1);
  for (int i = 0; i < 10; ++i) logger.info("{}", line);
  CHECK(sink->lines_not_shown() == 11);
  // The reader resumes: every queued byte arrives, the logged lines last.
  sink->attach_console(nullptr);
  const size_t queued = ddprun::agent::Console::kHighWater + (logged - 1) * 1001;
  std::string got;
  char buf[65536];
  while (got.size() < queued) {
    ssize_t n = read(pipe.read.get(), buf, sizeof buf);
    REQUIRE(n > 0);
    got.append(buf, static_cast<size_t>(n));
  }
  CHECK(console->drain_until(std::chrono::steady_clock::now() + Seconds(10)));
  console.reset();  // joins its writer
  CHECK(got.size() == queued);
  CHECK(got.substr(got.size() - 1001) == line + "\n");
}

TEST_CASE("ddprun.log keeps the lines logged before its run folder existed") {
  // The rendezvous join and the first store connection log before the run
  // folder (and so ddprun.log) exists; the sink keeps them for the file.
  TempDir dir;
  auto pipe = ddprun::base::make_pipe();
  auto sink = std::make_shared<ddprun::agent::LogSink>();
  spdlog::logger logger("test", sink);
  logger.set_pattern("%v");
  ddprun::base::ScopedFd saved_stderr(dup(STDERR_FILENO));  // early lines also go to stderr
  REQUIRE(dup2(pipe.write.get(), STDERR_FILENO) == STDERR_FILENO);
  logger.info("before the folder");
  REQUIRE(dup2(saved_stderr.get(), STDERR_FILENO) == STDERR_FILENO);
  saved_stderr.reset();
  const std::string path = dir.path() + "/ddprun.log";
  sink->attach_file(ddprun::base::ScopedFd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644)));
  logger.info("after the folder");
  // Written by the sink's writer thread: closing waits for it (bounded).
  sink->close_file(std::chrono::steady_clock::now() + std::chrono::seconds(30));
  CHECK(slurp(path) == "before the folder\nafter the folder\n");
  char buf[64];
  CHECK(read(pipe.read.get(), buf, sizeof buf) == static_cast<ssize_t>(sizeof "before the folder"));
}

TEST_CASE("--tee shows teed streams on the console and writes their files; -r alone files only") {
  TempDir dir;
  auto teed = run_ddprun({"--nproc-per-node=2", "-r", "3", "-t", "3", "--rdzv-id=tee", "--log-dir",
                          dir.path() + "/a", TEST_WORKER, "lines", "3"});
  REQUIRE(teed.status == 0);
  CHECK(lines_with(teed.out, "[default0]:rank=0 line=").size() == 3);
  CHECK(lines_with(teed.out, "[default1]:rank=1 line=").size() == 3);
  CHECK(count_of(files_named(dir.path() + "/a", "stdout.log"), " line=") == 6);

  auto redirected = run_ddprun({"--nproc-per-node=2", "-r", "3", "--rdzv-id=red", "--log-dir",
                                dir.path() + "/b", TEST_WORKER, "lines", "3"});
  REQUIRE(redirected.status == 0);
  CHECK(redirected.out.empty());
  CHECK(count_of(files_named(dir.path() + "/b", "stdout.log"), " line=") == 6);

  // Without --log-dir, teed files go to a kept folder that ddprun names,
  // under $TMPDIR (here the test's own folder, so no run leaves one in /tmp).
  const std::string tmp = dir.path() + "/tmp";
  std::filesystem::create_directory(tmp);
  auto no_dir = run_ddprun({"-t", "1", TEST_WORKER, "lines", "2"}, {"TMPDIR=" + tmp});
  REQUIRE(no_dir.status == 0);
  CHECK(lines_with(no_dir.out, "[default0]:rank=0 line=").size() == 2);
  CHECK(no_dir.err.find("redirected output goes to " + tmp + "/ddprun_logs.") != std::string::npos);
  CHECK(count_of(files_named(tmp, "stdout.log"), " line=") == 2);
}

TEST_CASE("a 10 MB line is cut only at the documented size, each piece marked") {
  using ddprun::agent::LineSplitter;
  constexpr size_t kSize = 10'000'000;
  auto r = run_ddprun({TEST_WORKER, "long-line", std::to_string(kSize)}, {}, Seconds(120));
  REQUIRE(r.status == 0);
  std::string joined;
  size_t pieces = 0;
  std::istringstream in(r.out);
  std::string line;
  std::string mark = "[default0]:" + std::string(LineSplitter::kContinuation);
  while (std::getline(in, line)) {
    std::string head = pieces == 0 ? "[default0]:" : mark;
    REQUIRE(line.rfind(head, 0) == 0);
    std::string body = line.substr(head.size());
    if (pieces == 0 || joined.size() + body.size() < kSize)
      CHECK(body.size() == LineSplitter::kDefaultMaxLine);  // whole up to the limit
    joined += body;
    ++pieces;
  }
  CHECK(pieces == (kSize + LineSplitter::kDefaultMaxLine - 1) / LineSplitter::kDefaultMaxLine);
  REQUIRE(joined.size() == kSize);
  bool same = true;
  for (size_t i = 0; i < kSize && same; ++i) same = joined[i] == "0123456789"[i % 10];
  CHECK(same);

  // Exactly the limit: one line.
  auto whole = run_ddprun({TEST_WORKER, "long-line", std::to_string(LineSplitter::kDefaultMaxLine)});
  REQUIRE(whole.status == 0);
  CHECK(whole.out.size() == LineSplitter::kDefaultMaxLine + std::string("[default0]:\n").size());
}

namespace {

using ddprun::testing::thread_count;

// In a forked child, where no thread of another case comes or goes: 0 when
// a console made no thread until its first bytes, and wrote them.
int console_thread_steps() {
  if (thread_count() != 1) return 1;
  boost::asio::io_context io;
  int fds[2];
  if (pipe(fds) != 0) return 2;
  {
    ddprun::agent::Console unused(io, fds[1], false);
    if (thread_count() != 1) return 3;  // none until bytes come
  }
  if (thread_count() != 1) return 4;  // and none at its end
  {
    ddprun::agent::Console c(io, fds[1], false);
    c.write(nullptr, "first\n");
    if (thread_count() != 2) return 5;
    if (!c.drain_until(std::chrono::steady_clock::now() + std::chrono::seconds(30))) return 6;
  }
  if (thread_count() != 1) return 7;  // joined
  char buf[16] = {};
  if (read(fds[0], buf, sizeof buf - 1) != 6 || std::string(buf) != "first\n") return 8;
  return 0;
}

}  // namespace

TEST_CASE("a console's writer thread starts with its first bytes; one never written to has none") {
#ifdef __SANITIZE_THREAD__
  // ThreadSanitizer's runtime runs threads of its own and refuses new ones
  // after a multi-threaded fork: counting threads means nothing there.
  SKIP_TEST("thread counts under ThreadSanitizer (its own threads)");
#endif
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) _exit(console_thread_steps());
  int status = 0;
  // Bounded by the child's own deadline (the 30 s drain).
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);  // else: the step of console_thread_steps that failed
}
