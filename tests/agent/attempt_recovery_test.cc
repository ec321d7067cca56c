// Attempt with --restart-scope=rank on a fake launcher and a ManualClock
// (rank_recovery.cc): which messages each worker's channel carries, who
// is signalled, when the attempt falls back to the group teardown. The test
// speaks for the workers on their channel ends (FakeLauncher::channel); no
// process is started and no test waits. restart_scope_test.cc runs the
// same on real processes.
#include <doctest/doctest.h>
#include <errno.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tests/agent/attempt_harness.h"

namespace ag = ddprun::agent;
using namespace std::chrono_literals;
using namespace ag::test;

namespace {

// Rank scope, `restarts` of --max-restarts, a 10 s --recovery-timeout.
std::function<void(ag::Options&)> rank_scope(int restarts) {
  return [restarts](ag::Options& o) {
    o.restart_scope = ag::RestartScope::kRank;
    o.max_restarts = restarts;
    o.recovery_timeout = std::chrono::seconds(10);
  };
}

// Every packet waiting on the fake worker's end, in order, one a line.
std::string packets(Harness& h, int worker) {
  h.io.poll();
  std::string out;
  const int fd = h.launcher.channel(worker);
  if (fd < 0) return out;
  char buf[600];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0) break;
    out += std::string(buf, static_cast<size_t>(n)) + "\n";
  }
  return out;
}

void send_joined(Harness& h, int worker, int generation, int rank) {
  const std::string p =
      "event=joined generation=" + std::to_string(generation) + " rank=" + std::to_string(rank);
  REQUIRE(send(h.launcher.channel(worker), p.data(), p.size(), 0) == static_cast<ssize_t>(p.size()));
  h.io.poll();
}

bool has_env(const ddprun::agent::SpawnRequest& r, const std::string& kv) {
  return std::count(r.env.begin(), r.env.end(), kv) > 0;
}

bool has_env_key(const ddprun::agent::SpawnRequest& r, const std::string& key) {
  return std::any_of(r.env.begin(), r.env.end(),
                     [&](const std::string& kv) { return kv.rfind(key + "=", 0) == 0; });
}

}  // namespace

TEST_CASE("group scope gives workers no channel and none of its variables") {
  Harness h(2);
  h.start();
  for (const auto& r : h.launcher.requests) {
    CHECK(r.inherit_fds.empty());
    CHECK_FALSE(has_env_key(r, "DDPRUN_RECOVERY_FD"));
    CHECK_FALSE(has_env_key(r, "DDPRUN_RESTART_SCOPE"));
    CHECK_FALSE(has_env_key(r, "DDPRUN_GENERATION"));
  }
}

TEST_CASE("rank scope: a failed rank alone is replaced; the survivors hear failed, ready, recovered") {
  Harness h(3, 5.0, rank_scope(2));
  h.start();
  for (int w = 0; w < 3; ++w) {
    const auto& r = h.launcher.requests[w];
    REQUIRE(r.inherit_fds.size() == 1);
    CHECK(has_env(r, "DDPRUN_RESTART_SCOPE=rank"));
    CHECK(has_env(r, "DDPRUN_GENERATION=0"));
    CHECK(has_env(r, "DDPRUN_RECOVERY_FD=" + std::to_string(r.inherit_fds[0])));
  }
  h.launcher.exit(1, exited_with(3));
  h.reap();
  // No drain, no teardown: the dead rank's group is SIGKILLed (what it
  // started), nobody else is signalled, and spawn 3 takes its slot.
  CHECK(h.launcher.signals_to(1) == std::vector<int>{SIGKILL});
  CHECK(h.launcher.signals_to(0).empty());
  CHECK(h.launcher.signals_to(2).empty());
  REQUIRE(h.launcher.requests.size() == 4);
  const auto& fresh = h.launcher.requests[3];
  CHECK(has_env(fresh, "RANK=1"));
  CHECK(has_env(fresh, "LOCAL_RANK=1"));
  CHECK(has_env(fresh, "WORLD_SIZE=3"));
  CHECK(has_env(fresh, "DDPRUN_GENERATION=1"));
  CHECK(h.attempt->info().workers[1].pid == h.launcher.pid_of(3));
  CHECK_FALSE(h.hooks.failed);
  for (int w : {0, 2})
    CHECK(packets(h, w) == "event=failed generation=1 ranks=1 cause=exit\n" "event=ready generation=1 ranks=1\n");
  CHECK(packets(h, 3) == "");
  // A joined for another generation counts for nothing.
  send_joined(h, 0, 0, 0);
  send_joined(h, 0, 1, 0);
  send_joined(h, 2, 1, 2);
  CHECK(packets(h, 0) == "");
  send_joined(h, 3, 1, 1);
  for (int w : {0, 2, 3})
    CHECK(packets(h, w) == "event=recovered generation=1 ranks=1\n");
  REQUIRE(h.hooks.recoveries.size() == 3);
  CHECK(h.hooks.recoveries[0].kind == ag::RecoveryEvent::Kind::kFailed);
  CHECK(h.hooks.recoveries[1].kind == ag::RecoveryEvent::Kind::kReplaced);
  CHECK(h.hooks.recoveries[1].replacement->pid == h.launcher.pid_of(3));
  CHECK(h.hooks.recoveries[2].kind == ag::RecoveryEvent::Kind::kJoined);
  CHECK(h.clock.armed_timers() == 0);  // the recovery's deadline went with it
  for (int w : {0, 2, 3}) h.launcher.exit(w, exited_with(0));
  h.reap();
  REQUIRE(h.attempt->done());
  CHECK(h.attempt->result().outcome == ag::Outcome::kSucceeded);
  CHECK(h.attempt->result().rank_restarts == 1);
}

TEST_CASE("rank scope: a second failure before every rank joined falls back to the group teardown") {
  Harness h(2, 5.0, rank_scope(3));
  h.start();
  h.launcher.exit(1, exited_with(3));
  h.reap();
  (void)packets(h, 0);
  send_joined(h, 0, 1, 0);
  h.launcher.exit(2, exited_with(4));  // the replacement, before it joined
  h.reap();
  CHECK(packets(h, 0) == "event=fallback reason=second_failure\n");
  REQUIRE(h.hooks.failed);
  CHECK(h.hooks.failed->local_rank == 1);
  CHECK(h.hooks.failed->exit_code == 4);
  CHECK(h.hooks.recoveries.back().kind == ag::RecoveryEvent::Kind::kFallback);
  CHECK(h.hooks.recoveries.back().reason == "second_failure");
  // Then today's path: the drain, SIGTERM, the group gone.
  h.clock.advance(ag::Attempt::kFailureDrain);
  CHECK(h.launcher.signals_to(0) == std::vector<int>{SIGTERM, SIGCONT});
  h.reap();
  REQUIRE(h.attempt->done());
  CHECK(h.attempt->result().outcome == ag::Outcome::kFailed);
  CHECK(h.attempt->result().rank_restarts == 1);
}

TEST_CASE("rank scope: with no restart left a failure takes the group path, and says so") {
  Harness h(2, 5.0, rank_scope(0));
  h.start();
  h.launcher.exit(0, exited_with(3));
  h.reap();
  CHECK(packets(h, 1) == "event=fallback reason=no_restart_left\n");
  CHECK(h.launcher.requests.size() == 2);
  REQUIRE(h.hooks.failed);
  CHECK(h.hooks.failed->exit_code == 3);
}

TEST_CASE("rank scope: the recovery must end within --recovery-timeout, else the group stops") {
  Harness h(2, 5.0, rank_scope(2));
  h.launcher.ignore(0, SIGTERM);  // its channel stays open to read
  h.start();
  h.launcher.exit(1, exited_with(3));
  h.reap();
  (void)packets(h, 0);
  send_joined(h, 2, 1, 1);  // only the replacement joins
  h.clock.advance(10s - 1ms);
  CHECK(h.launcher.signals_to(0).empty());
  h.clock.advance(1ms);
  CHECK(packets(h, 0) == "event=fallback reason=timeout\n");
  REQUIRE(h.hooks.failed);
  CHECK(h.hooks.failed->reason.find("not joined: rank 0") != std::string::npos);
  CHECK(h.launcher.signals_to(0) == std::vector<int>{SIGTERM, SIGCONT});
}

TEST_CASE("rank scope: a replacement that cannot start falls back, blaming the first failure") {
  Harness h(2, 5.0, rank_scope(2));
  h.launcher.fail_spawn_at = 2;
  h.launcher.ignore(0, SIGTERM);  // its channel stays open to read
  h.start();
  h.launcher.exit(1, exited_with(3));
  h.reap();
  CHECK(packets(h, 0) == "event=failed generation=1 ranks=1 cause=exit\n" "event=fallback reason=spawn_failed\n");
  REQUIRE(h.hooks.failed);
  CHECK(h.hooks.failed->local_rank == 1);
  CHECK(h.hooks.failed->exit_code == 3);
  CHECK(h.launcher.signals_to(0) == std::vector<int>{SIGTERM, SIGCONT});
  h.clock.advance(5s);  // --term-timeout
  h.reap();
  REQUIRE(h.attempt->done());
}

TEST_CASE("rank scope: a hang's culprit alone gets the traceback signal, then SIGKILL, then a successor") {
  Harness h(3, 5.0, rank_scope(1));
  h.launcher.ignore(2, SIGABRT);  // no faulthandler: it stays until SIGKILL
  h.start();
  ag::FailRequest req;
  req.reason = "hang: rank 2 made no progress";
  req.local_rank = 0;  // the rank whose deadline passed first
  req.replace_local_rank = 2;
  req.signal = SIGABRT;
  req.targets = {2};
  req.wait = 5000ms;
  req.exit_code = 124;
  h.hooks.control->fail_attempt(req);
  h.io.poll();
  CHECK(h.launcher.signals_to(2) == std::vector<int>{SIGABRT, SIGCONT});
  CHECK(h.launcher.signals_to(0).empty());
  for (int w : {0, 1})
    CHECK(packets(h, w) == "event=failed generation=1 ranks=2 cause=hang\n");
  h.clock.advance(5000ms);
  CHECK(h.launcher.signals_to(2).back() == SIGKILL);
  h.reap();
  REQUIRE(h.launcher.requests.size() == 4);
  CHECK(has_env(h.launcher.requests[3], "RANK=2"));
  CHECK(has_env(h.launcher.requests[3], "DDPRUN_GENERATION=1"));
  for (int w : {0, 1})
    CHECK(packets(h, w) == "event=ready generation=1 ranks=2\n");
  CHECK_FALSE(h.hooks.failed);
  // No restart is left now: a second hang takes the group path.
  for (int w : {0, 1}) send_joined(h, w, 1, w);
  send_joined(h, 3, 1, 2);
  ag::FailRequest again = req;
  again.replace_local_rank = 0;
  again.signal = 0;
  h.hooks.control->fail_attempt(again);
  REQUIRE(h.hooks.failed);
  CHECK(h.hooks.failed->exit_code == 124);
  CHECK(h.launcher.signals_to(1) == std::vector<int>{SIGTERM, SIGCONT});
}

TEST_CASE("rank scope with a standby: it takes the failed slot on event=assign, is replaced, and ends with the ranks") {
  Harness h(2, 5.0, [](ag::Options& o) {
    rank_scope(2)(o);
    o.standby_workers = 1;
  });
  h.start();
  // Spawn 2 is the standby: a channel, DDPRUN_STANDBY, no rank.
  REQUIRE(h.launcher.requests.size() == 3);
  const auto& standby = h.launcher.requests[2];
  CHECK(standby.inherit_fds.size() == 1);
  CHECK(has_env(standby, "DDPRUN_STANDBY=1"));
  CHECK(has_env(standby, "WORLD_SIZE=2"));
  CHECK_FALSE(has_env_key(standby, "RANK"));
  CHECK_FALSE(has_env_key(standby, "LOCAL_RANK"));
  CHECK(h.attempt->info().workers.size() == 2);
  h.launcher.exit(1, exited_with(3));
  h.reap();
  // No spawn at the failure: the standby is told its slot.
  CHECK(h.launcher.signals_to(1) == std::vector<int>{SIGKILL});
  CHECK(h.launcher.signals_to(2).empty());
  CHECK(h.launcher.requests.size() == 3);
  CHECK(packets(h, 2) == "event=assign generation=1 rank=1 local_rank=1\n");
  CHECK(packets(h, 0) == "event=failed generation=1 ranks=1 cause=exit\n"
                         "event=ready generation=1 ranks=1\n");
  CHECK(h.attempt->info().workers[1].pid == h.launcher.pid_of(2));
  REQUIRE(h.hooks.recoveries.size() == 2);
  CHECK(h.hooks.recoveries[1].kind == ag::RecoveryEvent::Kind::kReplaced);
  CHECK(h.hooks.recoveries[1].standby == 1);
  CHECK(h.hooks.recoveries[1].replacement->pid == h.launcher.pid_of(2));
  send_joined(h, 0, 1, 0);
  send_joined(h, 2, 1, 1);
  for (int w : {0, 2}) CHECK(packets(h, w) == "event=recovered generation=1 ranks=1\n");
  // The recovery is over: standby 2 starts (spawn 3).
  REQUIRE(h.launcher.requests.size() == 4);
  CHECK(has_env(h.launcher.requests[3], "DDPRUN_STANDBY=2"));
  // It dies before it is assigned: no failure, standby 3 (spawn 4) starts.
  h.launcher.exit(3, exited_with(5));
  h.reap();
  CHECK_FALSE(h.hooks.failed);
  CHECK(h.hooks.exited == std::vector<int>{1});  // a standby's end is no rank's
  REQUIRE(h.launcher.requests.size() == 5);
  CHECK(has_env(h.launcher.requests[4], "DDPRUN_STANDBY=3"));
  // Every rank ends: the standby is SIGKILLed, then the attempt is done.
  for (int w : {0, 2}) h.launcher.exit(w, exited_with(0));
  h.reap();
  REQUIRE_FALSE(h.launcher.signals_to(4).empty());
  CHECK(h.launcher.signals_to(4).front() == SIGKILL);
  h.reap();
  REQUIRE(h.attempt->done());
  CHECK(h.attempt->result().outcome == ag::Outcome::kSucceeded);
  CHECK(h.attempt->result().rank_restarts == 1);
}
