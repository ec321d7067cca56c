// Console lines are whole and prefixed; log files per attempt and rank.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <fstream>
#include <sstream>
#include <thread>

#include <boost/asio/io_context.hpp>

#include "agent/output_pump.h"
#include "base/queued_writer.h"
#include "tests/agent/ddprun_process.h"
#include "tests/common/run_folder.h"
#include "tests/common/slurp.h"
#include "tests/common/temp_dir.h"

using namespace ddprun::testing;
namespace fs = std::filesystem;

namespace {

}  // namespace

TEST_CASE("50,000 lines from 4 workers come out whole and prefixed") {
  constexpr int kWorkers = 4, kLines = 12500;
  auto r = run_ddprun({"--nproc-per-node=4", TEST_WORKER, "lines", std::to_string(kLines)},
                      {}, Seconds(120));
  REQUIRE_FALSE(r.timed_out);
  REQUIRE(r.status == 0);
  std::vector<int> next(kWorkers, 0);
  int bad = 0;
  std::istringstream in(r.out);
  std::string line;
  while (std::getline(in, line)) {
    // "[default<r>]:rank=<r> line=<i> " + 'x' * (i % 97)
    int rank = -1, i = -1;
    char tail[2];
    if (std::sscanf(line.c_str(), "[default%d]:rank=%*d line=%d%1c", &rank, &i, tail) != 3 ||
        rank < 0 || rank >= kWorkers) {
      ++bad;
      continue;
    }
    std::string expected = "[default" + std::to_string(rank) + "]:rank=" + std::to_string(rank) +
                           " line=" + std::to_string(i) + " " + std::string(i % 97, 'x');
    if (line != expected || i != next[rank]) {
      ++bad;
      continue;
    }
    ++next[rank];
  }
  CHECK(bad == 0);
  for (int rank = 0; rank < kWorkers; ++rank) CHECK(next[rank] == kLines);
}

TEST_CASE("--log-dir writes per attempt and rank files; -r keeps a stream off the console") {
  TempDir dir;
  auto r = run_ddprun({"--nproc-per-node=2", "--max-restarts=1", "--rdzv-id=logs", "--log-dir",
                       dir.path(), "-r", "0:1", TEST_WORKER, "crash-first", "1", "3"});
  REQUIRE_FALSE(r.timed_out);
  REQUIRE(r.status == 0);
  std::string run = run_folder(dir.path(), "logs");
  REQUIRE(!run.empty());
  for (int attempt = 0; attempt < 2; ++attempt)
    for (int rank = 0; rank < 2; ++rank) {
      std::string d = run + "/attempt_" + std::to_string(attempt) + "/" + std::to_string(rank);
      CAPTURE(d);
      CHECK(slurp(d + "/stdout.log").rfind("start rank=" + std::to_string(rank) + " restart=" +
                                               std::to_string(attempt), 0) == 0);
      CHECK(fs::exists(d + "/stderr.log"));
    }
  CHECK(lines_with(r.out, "[default0]:").empty());  // redirected
  CHECK(lines_with(r.out, "[default1]:start").size() == 2);
}

TEST_CASE("the prefix template, the rank filter and a partial last line") {
  auto r = run_ddprun({"--nproc-per-node=2", "--local-ranks-filter=1",
                       "--log-line-prefix-template=${role_name}/${rank}/${local_rank}| ",
                       "--role=w", "--no-python", "/usr/bin/printf", "a\\nno newline"});
  REQUIRE(r.status == 0);
  CHECK(r.out == "w/1/1| a\nw/1/1| no newline\n");
}

// The worker is console_worker.py run by plain `python3` (no torch); the
// bytes it should produce come from running it directly, without ddprun.
TEST_CASE("--log-line-prefix-template=none passes a worker's bytes through untouched") {
  const std::string worker = std::string(WORKERS_DIR) + "/console_worker.py";
  DdprunProcess direct({"python3", worker, "emit"}, {"RANK=0"}, "/usr/bin/env");
  Finished expected = direct.finish(Seconds(60));
  REQUIRE(expected.status == 0);
  REQUIRE(expected.out.size() > 70000);
  auto r = run_ddprun({"--nproc-per-node=1", "--log-line-prefix-template=none", worker, "emit"});
  REQUIRE_FALSE(r.timed_out);
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(r.out == expected.out);  // byte for byte: no prefix, no newline added
}

TEST_CASE("--log-line-prefix-template=none keeps two ranks' lines whole") {
  const std::string worker = std::string(WORKERS_DIR) + "/console_worker.py";
  auto r = run_ddprun({"--nproc-per-node=2", "--log-line-prefix-template=none", worker, "emit"});
  REQUIRE(r.status == 0);
  // Every JSON line of each rank is whole (pieces of 997 bytes were not
  // interleaved inside it). A rank's last line has no newline, so what
  // follows it joins it, as when both write to one terminal: no line starts
  // are asserted.
  CHECK(count_of(r.out, std::string(70000, 'x') + "\n") == 2);
  CHECK(count_of(r.out, "\n" + std::string(70001, 'x')) == 0);
  for (int rank = 0; rank < 2; ++rank)
    for (int i = 0; i < 50; ++i) {
      std::string line = "{\"rank\": " + std::to_string(rank) + ", \"i\": " + std::to_string(i) +
                         ", \"s\": \"a\tb\"}\n";
      CAPTURE(line);
      CHECK(count_of(r.out, line) == 1);
    }
}

// All ranks fail at import, rank 1 after rank 0 (console_worker.py, plain
// python3): rank 1's traceback still reaches the console, because the agent
// leaves it Attempt::kFailureDrain before the stop signal. Twice, since a
// lost traceback was a race.
TEST_CASE("every rank's traceback reaches the console when all fail at import") {
  const std::string worker = std::string(WORKERS_DIR) + "/console_worker.py";
  for (int run = 0; run < 2; ++run) {
    TempDir dir;
    auto r = run_ddprun({"--nproc-per-node=2", worker, "import-error", dir.path()});
    REQUIRE_FALSE(r.timed_out);
    CAPTURE(r.err);
    CHECK(r.status == 1);
    for (int rank = 0; rank < 2; ++rank) {
      std::string p = "[default" + std::to_string(rank) + "]:";
      CHECK(lines_with(r.err, p + "Traceback (most recent call last):").size() == 1);
      CHECK(lines_with(r.err, p + "ModuleNotFoundError: No module named 'no_such_module_" +
                                  std::to_string(rank) + "'").size() == 1);
    }
  }
}

// The same behind a wrapper that runs python without exec (a shell script;
// pyenv's shim on its way): the worker ddprun started sleeps in wait()
// while its child works, and the failure drain must see the child's work.
// Rank 1 is still busy (import-error-late) when the drain starts.
TEST_CASE("a rank behind a wrapper script still gets to print its traceback") {
  const std::string worker = std::string(WORKERS_DIR) + "/console_worker.py";
  TempDir dir;
  // `; exit $?`: the shell cannot exec its last command, as a script would not.
  auto r = run_ddprun({"--nproc-per-node=2", "/bin/sh", "-c",
                       "python3 \"$0\" import-error-late \"$1\"; exit $?", worker, dir.path()});
  REQUIRE_FALSE(r.timed_out);
  CAPTURE(r.err);
  CHECK(r.status == 1);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string p = "[default" + std::to_string(rank) + "]:";
    CHECK(lines_with(r.err, p + "ModuleNotFoundError: No module named 'no_such_module_" +
                                std::to_string(rank) + "'").size() == 1);
  }
}

// Rank 1 reads /dev/null (only rank 0 gets ddprun's stdin): its input()
// raises EOFError, its breakpoint() quits; ddprun says why, naming the flag.
// console_worker.py with plain python3.
TEST_CASE("a rank whose input() or pdb finds no input is told about --stdin-rank") {
  const std::string worker = std::string(WORKERS_DIR) + "/console_worker.py";
  for (const char* mode : {"input-rank1", "pdb-rank1"}) {
    CAPTURE(mode);
    auto r = run_ddprun({"--nproc-per-node=2", worker, mode});
    REQUIRE_FALSE(r.timed_out);
    CAPTURE(r.err);
    CHECK(r.status == 1);
    CHECK(count_of(r.err, "rank 1 read standard input, but only rank 0 gets it (the others read "
                          "/dev/null); --stdin-rank=1 gives it to rank 1") == 1);
  }
  auto r = run_ddprun({"--nproc-per-node=2", "--stdin-rank=none", worker, "input-rank1"});
  CHECK(count_of(r.err, "rank 1 read standard input, but no rank gets it (--stdin-rank=none); "
                        "--stdin-rank=1 gives it to rank 1") == 1);
}

TEST_CASE("a log file that stops taking bytes never stalls the loop: all is read, the gap is marked") {
  // The log file is a FIFO nobody reads yet (it takes 64 KiB, then its
  // writer blocks, as on a stalled NFS folder). The pump on this loop must
  // still read all 2 MiB the worker side writes: a loop blocked in the log
  // file's write() would never get to the end, and the deadline fails it.
  using Clock = std::chrono::steady_clock;
  TempDir dir;
  const std::string fifo = dir.path() + "/stdout.log";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  ddprun::base::ScopedFd reader(::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  REQUIRE(reader.valid());
  ddprun::base::ScopedFd log(::open(fifo.c_str(), O_WRONLY | O_CLOEXEC));
  REQUIRE(log.valid());
  auto worker = ddprun::base::make_pipe();

  boost::asio::io_context io;
  ddprun::base::QueuedWriter::Options o;
  o.max_queued = 256 << 10;
  ddprun::agent::PumpConfig c;
  c.shown = false;  // redirected: the file only
  c.log = std::move(log);
  c.log_path = fifo;
  c.log_writer = std::make_shared<ddprun::base::QueuedWriter>(o);
  size_t seen = 0;
  bool eof = false;
  c.on_data = [&](std::string_view d) { seen += d.size(); };
  c.on_eof = [&] { eof = true; };
  ddprun::agent::OutputPump pump(io, std::move(worker.read), std::move(c));
  pump.start();

  std::string expected;
  for (int i = 0; expected.size() < (2u << 20); ++i) expected += "line " + std::to_string(i) + "\n";
  std::thread producer([&, fd = std::move(worker.write)]() mutable {
    (void)ddprun::base::write_fully(fd.get(), expected.data(), expected.size());
    fd.reset();  // EOF for the pump
  });
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  // Were the loop stuck in the file's write(), it would never look at the
  // deadline: past it this thread reads the FIFO empty to free it, and the
  // test fails instead of hanging.
  std::mutex mu;
  std::condition_variable cv;
  bool loop_done = false, rescued = false;
  std::thread rescuer([&] {
    std::unique_lock<std::mutex> lk(mu);
    if (cv.wait_until(lk, deadline, [&] { return loop_done; })) return;
    rescued = true;
    lk.unlock();
    char sink[65536];
    for (;;) {
      pollfd p{reader.get(), POLLIN, 0};
      if (::poll(&p, 1, 1000) <= 0) break;
      if (::read(reader.get(), sink, sizeof sink) <= 0) break;
    }
  });
  while (!eof && Clock::now() < deadline) io.run_one_for(std::chrono::milliseconds(100));
  {
    std::lock_guard<std::mutex> lk(mu);
    loop_done = true;
  }
  cv.notify_one();
  rescuer.join();
  producer.join();
  REQUIRE_FALSE(rescued);
  REQUIRE(eof);
  CHECK(seen == expected.size());

  // The reader catches up: a prefix of the lines, in order, then the notice.
  std::string text;
  char buf[65536];
  while (text.find("did not keep up\n") == std::string::npos && Clock::now() < deadline) {
    pollfd p{reader.get(), POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::read(reader.get(), buf, sizeof buf);
    if (n > 0) text.append(buf, static_cast<size_t>(n));
  }
  const size_t at = text.find("ddprun: ");
  REQUIRE(at != std::string::npos);
  CHECK(expected.compare(0, at, text, 0, at) == 0);
  const size_t dropped = expected.size() - at;  // all after the gap was dropped
  CHECK(text.substr(at) == ddprun::base::QueuedWriter::drop_notice(dropped, fifo));
}
