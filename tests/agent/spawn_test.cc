// spawn.h on real processes: start_process forks without waiting for the
// exec, so several workers are started before the first is finished; a
// child whose exec fails is reported (and reaped) by finish_process alone,
// and the others run on.
#include <doctest/doctest.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "agent/spawn.h"
#include "base/pidfd.h"

using namespace ddprun::agent;

namespace {

SpawnRequest request(const std::string& path) {
  SpawnRequest r;
  r.path = path;
  r.argv = {path};
  r.env = {"PATH=/usr/bin:/bin"};
  return r;
}

// Reaps `pid` once it has exited, within 30 s (it is /bin/true); its wait
// status, or -1.
int reap_within_30s(pid_t pid) {
  if (!ddprun::base::wait_exited(pid, std::chrono::steady_clock::now() + std::chrono::seconds(30))) {
    kill(pid, SIGKILL);
    return -1;
  }
  int status = 0;
  return waitpid(pid, &status, 0) == pid ? status : -1;
}

}  // namespace

TEST_CASE("three children forked before any exec is waited for; only the one that fails reports") {
  std::vector<StartedProcess> started;
  started.push_back(start_process(request("/bin/true")));
  started.push_back(start_process(request("/nonexistent/ddprun-spawn-test")));
  started.push_back(start_process(request("/bin/true")));
  for (const auto& s : started) REQUIRE(s.pid > 0);

  CHECK_NOTHROW(finish_process(started[0]));
  try {
    finish_process(started[1]);
    FAIL("finish_process did not report the failed exec");
  } catch (const SpawnError& e) {
    CHECK(e.program_fault());
    CHECK(e.exit_status() == 127);
    CHECK(std::string(e.what()) ==
          "cannot execute '/nonexistent/ddprun-spawn-test': No such file or directory");
  }
  CHECK_NOTHROW(finish_process(started[2]));

  // The failed child was reaped by finish_process; the others ran and exit 0.
  int status = 0;
  CHECK(waitpid(started[1].pid, &status, WNOHANG) < 0);
  CHECK(errno == ECHILD);
  for (int i : {0, 2}) {
    const int st = reap_within_30s(started[i].pid);
    REQUIRE(st != -1);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
  }
}

TEST_CASE("a worker gets stdio and its inherit_fds only: the agent's other descriptors, "
          "close-on-exec or not, stay behind") {
  // Like the store's listening socket, which Boost.Asio opens without
  // SOCK_CLOEXEC: kept open in the worker, it held the port after the agent.
  int leaky[2], kept[2];
  REQUIRE(pipe(leaky) == 0);
  REQUIRE(pipe2(kept, O_CLOEXEC) == 0);
  int out[2];
  REQUIRE(pipe2(out, O_CLOEXEC) == 0);
  SpawnRequest r = request("/bin/sh");
  // The fds the shell itself holds are listed by an exec'd ls, whose own
  // directory fd is its highest.
  r.argv = {"/bin/sh", "-c", "exec ls /proc/self/fd"};
  r.stdout_fd = out[1];
  r.inherit_fds = {kept[1]};
  StartedProcess s = start_process(r);
  CHECK_NOTHROW(finish_process(s));
  close(out[1]);
  std::string listing;
  char buf[256];
  for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;) listing.append(buf, size_t(n));
  close(out[0]);
  REQUIRE(reap_within_30s(s.pid) != -1);
  std::vector<int> fds;
  for (size_t at = 0; at < listing.size();) {
    const size_t nl = listing.find('\n', at);
    fds.push_back(std::stoi(listing.substr(at, nl - at)));
    at = nl == std::string::npos ? listing.size() : nl + 1;
  }
  CAPTURE(listing);
  // 0, 1, 2, the inherited one and ls's directory (the highest).
  REQUIRE(fds.size() == 5);
  CHECK(std::count(fds.begin(), fds.end(), kept[1]) == 1);
  CHECK(std::count(fds.begin(), fds.end(), leaky[0]) + std::count(fds.begin(), fds.end(), leaky[1]) +
            std::count(fds.begin(), fds.end(), kept[0]) <=
        1);  // at most one: ls's directory fd may reuse a closed number
  for (int fd : {leaky[0], leaky[1], kept[0], kept[1]}) close(fd);
}
