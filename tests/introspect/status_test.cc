// ddprun status --watch in a real terminal (a pty), and the control socket
// and registry refusing what they should.
#include <doctest/doctest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>

#include "introspect/client.h"
#include "introspect/registry.h"
#include "tests/agent/ddprun_process.h"
#include "tests/common/temp_dir.h"
#include "tests/introspect/one_rank_job.h"

namespace {

using ddprun::testing::DdprunProcess;
using ddprun::testing::TempDir;
using Clock = std::chrono::steady_clock;

std::size_t count(const std::string& s, const std::string& needle) {
  std::size_t n = 0;
  for (auto pos = s.find(needle); pos != std::string::npos; pos = s.find(needle, pos + 1)) ++n;
  return n;
}

// Waits for `pid` (our child) up to the deadline; -1 when it is still running.
int wait_child(pid_t pid, std::chrono::seconds limit) {
  const auto deadline = Clock::now() + limit;
  int status = 0;
  while (Clock::now() < deadline) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    ::poll(nullptr, 0, 20);  // a child's exit has no fd to wait on here
  }
  return -1;
}

}  // namespace

TEST_CASE("status --watch redraws in place on a terminal and ends with the job") {
  TempDir dir;
  const std::string registry = dir.file("registry"), until = dir.file("until");
  ::mkdir(registry.c_str(), 0700);
  const std::string run_id = "watch-" + std::to_string(::getpid());
  DdprunProcess job({"--nproc-per-node", "2", "--rdzv-id", run_id,
                     std::string(INTROSPECT_SCRIPTS) + "/beating_worker.py", "--until", until},
                    {"DDPRUN_REGISTRY_DIR=" + registry, "DDPRUN_PYTHON=/usr/bin/python3"});
  REQUIRE(job.wait_for_stdout(
      [](const std::string& o) {
        return o.find("ready 0") != std::string::npos && o.find("ready 1") != std::string::npos;
      },
      std::chrono::seconds(60)));
  int master = -1;
  const pid_t pid = ::forkpty(&master, nullptr, nullptr, nullptr);
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::setenv("DDPRUN_REGISTRY_DIR", registry.c_str(), 1);
    ::execl(DDPRUN_BIN, DDPRUN_BIN, "status", run_id.c_str(), "--watch", "--interval", "0.2",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Read the terminal until two full redraws (clear + home, then a table).
  std::string screen;
  const std::string clear = "\x1b[H\x1b[2J";
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline && count(screen, clear) < 3) {
    pollfd p{master, POLLIN, 0};
    if (::poll(&p, 1, 1000) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(master, buf, sizeof buf);
    if (n <= 0) break;
    screen.append(buf, static_cast<std::size_t>(n));
  }
  INFO("terminal: " << screen);
  REQUIRE(count(screen, clear) >= 3);
  const std::string last = screen.substr(screen.rfind(clear, screen.rfind(clear) - 1));
  CHECK(last.find("RANK") != std::string::npos);
  CHECK(last.find("run " + run_id) != std::string::npos);
  // The job ends: --watch sees no agent left and exits 0 by itself.
  std::ofstream(until).put('\n');
  CHECK(job.finish(std::chrono::seconds(60)).status == 0);
  // Drain the terminal so the watcher never blocks writing to it.
  int rc = -1;
  const auto end = Clock::now() + std::chrono::seconds(30);
  while (rc < 0 && Clock::now() < end) {
    pollfd p{master, POLLIN, 0};
    char buf[4096];
    if (::poll(&p, 1, 100) > 0 && ::read(master, buf, sizeof buf) <= 0) {
      rc = wait_child(pid, std::chrono::seconds(10));
      break;
    }
    rc = wait_child(pid, std::chrono::seconds(0));
  }
  if (rc < 0) {
    ::kill(pid, SIGKILL);
    wait_child(pid, std::chrono::seconds(10));
  }
  ::close(master);
  CHECK(rc == 0);
}

TEST_CASE("status: the control socket answers an unknown request with an error") {
  ddprun::testing::OneRankJob one("bad");
  const std::string& socket = one.socket;
  // The socket lives in a folder only this user can enter.
  struct stat st{};
  const std::string folder = socket.substr(0, socket.rfind("/introspect/"));
  REQUIRE(::stat(folder.c_str(), &st) == 0);
  CHECK((st.st_mode & 077) == 0);
  const auto reply = ddprun::introspect::ask_agent(socket, {{"op", "reboot"}},
                                                   std::chrono::seconds(10));
  CHECK(reply["error"].get<std::string>().find("unknown op 'reboot'") != std::string::npos);
  // The agent still answers status afterwards.
  const auto ok = ddprun::introspect::ask_agent(socket, {{"op", "status"}},
                                                std::chrono::seconds(10));
  CHECK(ok["workers"].size() == 1);
  one.finish();
}

TEST_CASE("status: a registry folder others can write to is refused with a one-line error") {
  TempDir dir;
  const std::string registry = dir.file("open");
  ::mkdir(registry.c_str(), 0700);
  ::chmod(registry.c_str(), 0777);
  const auto r = ddprun::testing::run_ddprun({"status", "--registry", registry}, {},
                                             std::chrono::seconds(30));
  CHECK(r.status == 1);
  CHECK(r.err.find(registry + " is not a private folder") != std::string::npos);
  CHECK(count(r.err, "\n") == 1);
}
