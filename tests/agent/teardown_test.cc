// Teardown: grace then SIGKILL, signals to ddprun, and nothing left running
// even when ddprun itself is SIGKILLed.
#include <doctest/doctest.h>
#include <errno.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include "tests/agent/ddprun_process.h"

using namespace ddprun::testing;

namespace {

bool all_ready(const std::string& out, int n) { return count_of(out, ":ready rank=") == static_cast<size_t>(n); }

// Worker and grandchild pids from the "ready" lines, ordered by rank:
// {rank 0 worker, rank 0 grandchild, rank 1 worker, ...}.
std::vector<pid_t> announced_pids(const std::string& out) {
  std::vector<pid_t> pids;
  for (int rank = 0;; ++rank) {
    auto lines = lines_with(out, "[default" + std::to_string(rank) + "]:ready ");
    if (lines.size() != 1) return pids;
    pids.push_back(static_cast<pid_t>(field(lines[0], "pid")));
    pids.push_back(static_cast<pid_t>(field(lines[0], "child")));
  }
}

bool exists(pid_t pid) { return kill(pid, 0) == 0 || errno != ESRCH; }

}  // namespace

TEST_CASE("a worker that ignores SIGTERM is SIGKILLed after the grace period") {
  DdprunProcess p({"--nproc-per-node=2", "--term-timeout=1", TEST_WORKER, "ignore-term"});
  REQUIRE(p.wait_for_stdout([](const std::string& o) { return all_ready(o, 2); }, Seconds(20)));
  auto pids = announced_pids(p.out());
  REQUIRE(pids.size() == 4);
  // Rank 1 dies; rank 0 and both grandchildren ignore the SIGTERM that follows.
  REQUIRE(kill(pids[2], SIGUSR1) == 0);
  auto r = p.finish(Seconds(30));
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.status == 128 + SIGUSR1);
  CHECK(count_of(r.err, "still running 1 s after the stop signal; sending SIGKILL") == 1);
  CHECK(count_of(r.err, "failed with signal SIGUSR1") == 1);
  CHECK(count_of(r.err, "rank 0 (local rank 0, pid " + std::to_string(pids[0]) +
                            "): signal SIGKILL") == 1);
  // ddprun reaped everything before exiting.
  for (pid_t pid : pids) CHECK_FALSE(exists(pid));
}

TEST_CASE("SIGINT to ddprun stops every worker and grandchild and exits 130") {
  DdprunProcess p({"--nproc-per-node=2", "--term-timeout=10", TEST_WORKER, "block"});
  REQUIRE(p.wait_for_stdout([](const std::string& o) { return all_ready(o, 2); }, Seconds(20)));
  auto pids = announced_pids(p.out());
  REQUIRE(pids.size() == 4);
  p.send(SIGINT);
  auto r = p.finish(Seconds(30));
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.status == 130);
  CHECK(count_of(r.err, "got SIGINT; stopping the workers") == 1);
  for (pid_t pid : pids) CHECK_FALSE(exists(pid));
}

TEST_CASE("SIGTERM, SIGHUP and SIGQUIT to ddprun stop every worker and grandchild, exit 128+N") {
  for (int sig : {SIGTERM, SIGHUP, SIGQUIT}) {
    CAPTURE(sig);
    DdprunProcess p({"--nproc-per-node=2", "--term-timeout=10", TEST_WORKER, "block"});
    REQUIRE(p.wait_for_stdout([](const std::string& o) { return all_ready(o, 2); }, Seconds(20)));
    auto pids = announced_pids(p.out());
    REQUIRE(pids.size() == 4);
    p.send(sig);
    auto r = p.finish(Seconds(30));
    REQUIRE_FALSE(r.timed_out);
    CHECK(r.status == 128 + sig);
    for (pid_t pid : pids) CHECK_FALSE(exists(pid));
  }
}

TEST_CASE("a signal outside --signals-to-handle is not forwarded") {
  DdprunProcess p({"--nproc-per-node=1", "--signals-to-handle=SIGTERM", TEST_WORKER, "block"});
  REQUIRE(p.wait_for_stdout([](const std::string& o) { return all_ready(o, 1); }, Seconds(20)));
  auto pids = announced_pids(p.out());
  p.send(SIGTERM);
  auto r = p.finish(Seconds(30));
  CHECK(r.status == 128 + SIGTERM);
  for (pid_t pid : pids) CHECK_FALSE(exists(pid));
}

TEST_CASE("SIGKILL to ddprun leaves no worker and no grandchild alive") {
  // Orphans come to this test process, so it can see them die and reap them.
  REQUIRE(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
  std::vector<pid_t> pids;
  {
    DdprunProcess p({"--nproc-per-node=2", TEST_WORKER, "block"});
    REQUIRE(p.wait_for_stdout([](const std::string& o) { return all_ready(o, 2); }, Seconds(20)));
    pids = announced_pids(p.out());
    REQUIRE(pids.size() == 4);
    p.send(SIGKILL);
    auto r = p.finish(Seconds(30));  // EOF only once every holder of its pipes is gone
    REQUIRE_FALSE(r.timed_out);
    CHECK(r.status == 128 + SIGKILL);
  }
  for (pid_t pid : pids) CHECK(wait_dead(pid, Seconds(10)));
  // Reap what was re-parented to us; afterwards none of them may exist.
  while (waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  for (pid_t pid : pids) CHECK_FALSE(exists(pid));
  prctl(PR_SET_CHILD_SUBREAPER, 0);
}
