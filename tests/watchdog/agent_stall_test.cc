// The agent's own stalls are not the workers' fault: an agent that was
// SIGSTOPped for longer than --heartbeat-timeout while its workers kept
// beating blames no one on resume, and a stack capture that takes its time
// does not keep the agent from handling signals and exits meanwhile.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "tests/common/run_folder.h"
#include "tests/watchdog/test_util.h"

using ddprun::watchdog::testing::Child;
using ddprun::watchdog::testing::TempDir;
using nlohmann::json;

namespace {

constexpr auto kDeadline = std::chrono::seconds(60);

std::vector<std::string> event_names(const std::string& run_dir) {
  std::vector<std::string> names;
  std::ifstream in(run_dir + "/events.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto e = json::parse(line);
    // progress: the monitor's step samples (introspect/agent_hook.h), at its own pace.
    if (e["event"] != "worker_exit" && e["event"] != "progress") names.push_back(e["event"]);
  }
  return names;
}

int exit_code(const std::optional<int>& status) {
  REQUIRE_MESSAGE(status.has_value(), "ddprun did not finish within its deadline");
  return WIFEXITED(*status) ? WEXITSTATUS(*status) : 128 + WTERMSIG(*status);
}

}  // namespace

TEST_CASE("an agent SIGSTOPped longer than --heartbeat-timeout blames no beating worker") {
  TempDir dir;
  const std::string stop_file = dir.path() + "/stop";
  // ddprun's stderr joins its stdout, so the test reads one pipe.
  Child ddprun({DDPRUN_BIN, "--rdzv-id=pause", "--log-dir=" + dir.path() + "/logs",
                "--nproc-per-node=2", "--max-restarts=0", "--heartbeat-timeout=1",
                "--heartbeat-grace=30", WATCHDOG_TEST_WORKER, "until", stop_file, "20"},
               {}, true, "/dev/stdout");
  REQUIRE(ddprun.wait_for_output("beating"));
  // The pause itself is the scenario: three heartbeat timeouts with the
  // agent stopped and both workers beating into its socket.
  REQUIRE(::kill(ddprun.pid(), SIGSTOP) == 0);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  REQUIRE(::kill(ddprun.pid(), SIGCONT) == 0);
  // The agent notices it was not running and restarts the deadlines...
  CHECK(ddprun.wait_for_output("this agent did not run for"));
  // ...and the workers, still beating, finish the job.
  std::ofstream(stop_file) << "stop\n";
  CHECK(exit_code(ddprun.wait_for(kDeadline)) == 0);
  CHECK(event_names(ddprun::testing::run_folder(dir.path() + "/logs", "pause")) ==
        std::vector<std::string>{"start", "rendezvous", "done"});
}

TEST_CASE("SIGINT while a slow stack capture runs stops ddprun at once") {
  // Stand-ins for eu-stack and gdb that say they started, then take far
  // longer than their 10 s limit: the capture runs off the agent's loop, so
  // the agent still handles SIGINT (a blocked loop would wait 2 x 10 s).
  TempDir dir;
  const std::string fifo = dir.path() + "/capturing";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const char* tool : {"eu-stack", "gdb"}) {
    const std::string path = dir.path() + "/" + tool;
    std::ofstream(path) << "#!/bin/sh\necho started > \"$CAPTURE_FIFO\"\nexec sleep 600\n";
    REQUIRE(::chmod(path.c_str(), 0755) == 0);
  }
  // Opened before ddprun starts, non-blocking: poll waits for the writer.
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  REQUIRE(reader >= 0);
  const char* path = std::getenv("PATH");
  Child ddprun({DDPRUN_BIN, "--rdzv-id=capture", "--log-dir=" + dir.path() + "/logs",
                "--nproc-per-node=2", "--max-restarts=1", "--heartbeat-timeout=1",
                "--heartbeat-grace=30", WATCHDOG_TEST_WORKER, "scenario", "nobeat"},
               {{"PATH", dir.path() + ":" + (path ? path : "/usr/bin:/bin")},
                {"CAPTURE_FIFO", fifo}},
               true, "/dev/stdout");
  pollfd p{reader, POLLIN, 0};
  REQUIRE_MESSAGE(::poll(&p, 1, 60000) == 1, "the capture tool never started");
  ::close(reader);
  REQUIRE(::kill(ddprun.pid(), SIGINT) == 0);
  // Deadline: shorter than one tool's own 10 s limit.
  CHECK(exit_code(ddprun.wait_for(std::chrono::seconds(8))) == 130);
}

TEST_CASE("a worker that dies during a slow stack capture is handled at once") {
  // The same slow stand-in tools; this time the hung worker is SIGKILLed
  // while its stack is being captured. The loop sees the exit at once: the
  // attempt fails on it, the capture is cancelled, the group restarts and
  // the next attempt completes, all within one tool's 10 s limit.
  TempDir dir;
  const std::string fifo = dir.path() + "/capturing";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const char* tool : {"eu-stack", "gdb"}) {
    const std::string path = dir.path() + "/" + tool;
    // eu-stack is called as `eu-stack -p PID`: the pid goes to the test.
    std::ofstream(path) << "#!/bin/sh\necho \"$2\" > \"$CAPTURE_FIFO\"\nexec sleep 600\n";
    REQUIRE(::chmod(path.c_str(), 0755) == 0);
  }
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  REQUIRE(reader >= 0);
  const char* path = std::getenv("PATH");
  Child ddprun({DDPRUN_BIN, "--rdzv-id=capdie", "--log-dir=" + dir.path() + "/logs",
                "--nproc-per-node=2", "--max-restarts=1", "--heartbeat-timeout=1",
                "--heartbeat-grace=30", "--stack-capture=eu-stack", WATCHDOG_TEST_WORKER,
                "scenario", "nobeat"},
               {{"PATH", dir.path() + ":" + (path ? path : "/usr/bin:/bin")},
                {"CAPTURE_FIFO", fifo}},
               true, "/dev/stdout");
  pollfd p{reader, POLLIN, 0};
  REQUIRE_MESSAGE(::poll(&p, 1, 60000) == 1, "the capture tool never started");
  char buf[32] = {};
  const ssize_t n = ::read(reader, buf, sizeof(buf) - 1);
  ::close(reader);
  REQUIRE(n > 0);
  const pid_t hung = static_cast<pid_t>(std::atol(buf));
  REQUIRE(hung > 0);
  REQUIRE(::kill(hung, SIGKILL) == 0);
  CHECK(exit_code(ddprun.wait_for(std::chrono::seconds(8))) == 0);
}
