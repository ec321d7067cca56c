// spawn.h on real processes: start_process forks without waiting for the
// exec, so several workers are started before the first is finished; a
// child whose exec fails is reported (and reaped) by finish_process alone,
// and the others run on.
#include <doctest/doctest.h>
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
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
