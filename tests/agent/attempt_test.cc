// Attempt's teardown state machine on a fake launcher and a ManualClock:
// which signals go to which worker group and when, what a worker that
// ignores SIGTERM (or even SIGKILL) costs, exits that race the teardown, a
// spawn that fails half way. No process is started and no test waits: the
// grace period passes when the test moves the clock. (teardown_test.cc runs
// the same rules end to end on real processes.)
#include <doctest/doctest.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <optional>
#include <vector>

#include "tests/agent/attempt_harness.h"

namespace ag = ddprun::agent;
using namespace std::chrono_literals;
using namespace ag::test;

TEST_CASE("every worker exiting 0 is success, and nothing is signalled before they are reaped") {
  Harness h(3);
  h.start();
  CHECK(h.launcher.requests.size() == 3);
  CHECK(h.attempt->info().workers.size() == 3);
  for (int w = 0; w < 3; ++w) h.launcher.exit(w, exited_with(0));
  CHECK(h.launcher.sent.empty());
  h.reap();
  REQUIRE(h.attempt->done());
  CHECK(h.attempt->result().outcome == ag::Outcome::kSucceeded);
  CHECK_FALSE(h.attempt->result().root);
  CHECK(h.hooks.ended);
  // Once all are reaped, what they may have left behind is killed.
  CHECK(h.launcher.signals_to(0) == std::vector<int>{SIGKILL});
  CHECK(h.launcher.sweeps == 1);
  CHECK(h.clock.armed_timers() == 0);
}

TEST_CASE("a failure sends SIGTERM to every group; one that ignores it gets SIGKILL after --term-timeout") {
  Harness h(3, 5.0);
  h.launcher.ignore(2, SIGTERM);
  h.start();
  const auto t0 = h.clock.now();
  h.launcher.exit(1, exited_with(3));
  h.reap();
  // Rank 1's failure is the root cause; the others may end on their own for
  // kFailureDrain, then every group gets SIGTERM (and SIGCONT, should it be
  // stopped); rank 0 ends by it.
  REQUIRE(h.hooks.failed);
  CHECK(h.hooks.failed->local_rank == 1);
  CHECK(h.hooks.failed->exit_code == 3);
  h.clock.advance(ag::Attempt::kFailureDrain - 1ms);
  CHECK(h.launcher.sent.empty());
  h.clock.advance(1ms);
  const auto t1 = h.clock.now();
  CHECK(h.launcher.signals_to(0) == std::vector<int>{SIGTERM, SIGCONT});
  CHECK(h.launcher.signals_to(2) == std::vector<int>{SIGTERM, SIGCONT});
  h.reap();
  CHECK_FALSE(h.attempt->done());
  h.clock.advance(4999ms);
  CHECK(h.launcher.signals_to(2).size() == 2);  // still inside the grace
  h.clock.advance(1ms);
  CHECK(h.launcher.signals_to(2).back() == SIGKILL);
  CHECK(h.launcher.kill_job_calls >= 1);  // the cgroup too, for what left the groups
  h.reap();
  REQUIRE(h.attempt->done());
  const auto& r = h.attempt->result();
  CHECK(r.outcome == ag::Outcome::kFailed);
  CHECK(r.root->local_rank == 1);
  CHECK(r.root->when == t0);
  REQUIRE(r.ends.size() == 3);
  CHECK(r.ends[0].worker.local_rank == 1);
  CHECK(r.ends[1].worker.local_rank == 0);
  CHECK(r.ends[1].status.describe() == "signal SIGTERM");
  CHECK(r.ends[2].worker.local_rank == 2);
  CHECK(r.ends[2].status.describe() == "signal SIGKILL");
  CHECK(r.ends[2].when == t1 + 5s);
}

TEST_CASE("workers that exit during the grace period end the attempt without waiting for it") {
  Harness h(2, 30.0);
  h.start();
  h.launcher.exit(0, killed_by(SIGSEGV));
  h.reap();
  h.clock.advance(ag::Attempt::kFailureDrain);
  h.reap();  // rank 1 ends by the SIGTERM and is reaped in the same pass
  REQUIRE(h.attempt->done());
  CHECK(h.launcher.signals_to(1) == std::vector<int>{SIGTERM, SIGCONT, SIGKILL});
  CHECK(h.attempt->result().root->exit_code == 128 + SIGSEGV);
  CHECK(h.clock.armed_timers() == 0);  // the 30 s grace is not waited out
}

TEST_CASE("workers that all fail at once: the first reaped is the root cause, none is stopped") {
  Harness h(3);
  h.start();
  for (int w = 2; w >= 0; --w) h.launcher.exit(w, exited_with(10 + w));
  h.reap();
  REQUIRE(h.attempt->done());
  const auto& r = h.attempt->result();
  CHECK(r.root->local_rank == 2);
  CHECK(r.root->exit_code == 12);
  CHECK(r.ends.size() == 3);
  // All ended on their own inside the failure drain: no stop signal, only
  // the SIGKILL of what they may have left behind; no timer left.
  for (int w = 0; w < 3; ++w) CHECK(h.launcher.signals_to(w) == std::vector<int>{SIGKILL});
  CHECK(h.clock.armed_timers() == 0);
}

TEST_CASE("a failure leaves the others the failure drain to end on their own, then stops them") {
  Harness h(3);
  h.start();
  h.launcher.exit(0, exited_with(1));
  h.reap();
  // Rank 1 fails too inside the drain (its traceback reaches the console);
  // rank 2 is still running when it ends and gets the stop signal.
  h.clock.advance(ag::Attempt::kFailureDrain / 2);
  h.launcher.exit(1, exited_with(1));
  h.reap();
  CHECK(h.launcher.sent.empty());
  CHECK(h.attempt->result().root->local_rank == 0);
  h.clock.advance(ag::Attempt::kFailureDrain / 2);
  CHECK(h.launcher.signals_to(2) == std::vector<int>{SIGTERM, SIGCONT});
  h.reap();
  REQUIRE(h.attempt->done());
  CHECK(h.attempt->result().ends[1].status.describe() == "exit code 1");
}

TEST_CASE("the failure drain ends once every rank left is idle (waiting for the dead one, not printing)") {
  Harness h(3);
  h.launcher.hold_streams(2);
  h.start();
  h.launcher.exit(1, exited_with(3));
  h.reap();
  h.clock.advance(ag::Attempt::kIdleSample * 2);
  CHECK(h.launcher.sent.empty());  // ranks 0 and 2 still busy
  h.launcher.set_idle(0);
  h.clock.advance(ag::Attempt::kIdleSample);
  CHECK(h.launcher.sent.empty());  // rank 2 still busy
  // Rank 2 asleep, but its traceback waits in its pipe, unread (the loop
  // has not run since): a rank blocked writing into a full pipe looks just
  // like this, and is not idle.
  const char traceback[] = "Traceback (most recent call last):\n";
  REQUIRE(::write(h.launcher.held_stdout(2), traceback, sizeof traceback - 1) > 0);
  h.launcher.set_idle(2);
  h.clock.advance(ag::Attempt::kIdleSample * 2);
  CHECK(h.launcher.sent.empty());
  h.io.poll();  // the pump reads it: nothing is left waiting
  h.clock.advance(ag::Attempt::kIdleSample);
  CHECK(h.launcher.signals_to(0) == std::vector<int>{SIGTERM, SIGCONT});
  CHECK(h.launcher.signals_to(2) == std::vector<int>{SIGTERM, SIGCONT});
  h.launcher.drop_streams();
  h.reap();
  REQUIRE(h.attempt->done());
  CHECK(h.attempt->result().root->local_rank == 1);
}

TEST_CASE("a stop signal during the failure drain ends it at once") {
  Harness h(2);
  h.launcher.ignore(1, SIGINT);
  h.start();
  h.launcher.exit(0, exited_with(1));
  h.reap();
  h.attempt->interrupt(SIGINT);
  CHECK(h.launcher.signals_to(1) == std::vector<int>{SIGINT, SIGCONT});
  h.attempt->interrupt(SIGINT);  // a second one kills
  CHECK(h.launcher.signals_to(1).back() == SIGKILL);
  h.reap();
  CHECK(h.attempt->done());
}

TEST_CASE("a spawn that fails half way kills the workers already started and rethrows") {
  Harness h(4);
  h.launcher.fail_spawn_at = 2;
  CHECK_THROWS_AS(h.attempt->start(), ag::SpawnError);
  h.io.poll();
  CHECK(h.launcher.requests.size() == 2);
  // No grace: the job cannot run, so the two started are killed at once.
  CHECK(h.launcher.signals_to(0) == std::vector<int>{SIGKILL});
  CHECK(h.launcher.signals_to(1) == std::vector<int>{SIGKILL});
  CHECK_FALSE(h.attempt->done());
  h.reap();
  REQUIRE(h.attempt->done());
  const auto& r = h.attempt->result();
  CHECK(r.outcome == ag::Outcome::kFailed);
  CHECK(r.root->exit_code == 127);
  CHECK(r.root->reason == "cannot execute '/bin/true': No such file or directory");
  CHECK_FALSE(h.hooks.control);  // workers_started never came
}

TEST_CASE("every worker is forked before any exec is waited for; a failed exec kills the others") {
  Harness h(3);
  h.launcher.fail_exec_at = 1;
  CHECK_THROWS_AS(h.attempt->start(), ag::SpawnError);
  h.io.poll();
  // All three were started, then each one's exec was waited for in order.
  CHECK(h.launcher.requests.size() == 3);
  CHECK(h.launcher.finished ==
        std::vector<pid_t>{h.launcher.pid_of(0), h.launcher.pid_of(1), h.launcher.pid_of(2)});
  // The one that never ran gets no signal; the two that run are killed.
  CHECK(h.launcher.signals_to(0) == std::vector<int>{SIGKILL});
  CHECK(h.launcher.signals_to(1).empty());
  CHECK(h.launcher.signals_to(2) == std::vector<int>{SIGKILL});
  h.reap();
  REQUIRE(h.attempt->done());
  const auto& r = h.attempt->result();
  CHECK(r.outcome == ag::Outcome::kFailed);
  CHECK(r.root->exit_code == 126);
  CHECK(r.root->reason == "cannot execute '/bin/true': Text file busy");
  CHECK_FALSE(h.hooks.control);
}

TEST_CASE("a spawn that fails at the first worker ends the attempt at once") {
  Harness h(2);
  h.launcher.fail_spawn_at = 0;
  CHECK_THROWS_AS(h.attempt->start(), ag::SpawnError);
  CHECK(h.attempt->done());
  CHECK(h.attempt->result().outcome == ag::Outcome::kFailed);
  CHECK(h.launcher.sent.empty());
}

TEST_CASE("a worker that survives SIGKILL is given up on after the kill deadline") {
  Harness h(2, 1.0);
  h.launcher.ignore(1, SIGTERM);
  h.launcher.ignore(1, SIGKILL);  // stuck in the kernel (state D)
  h.start();
  h.launcher.exit(0, exited_with(1));
  h.reap();
  h.clock.advance(ag::Attempt::kFailureDrain);  // SIGTERM
  h.clock.advance(1s);  // grace over: SIGKILL
  h.reap();
  CHECK_FALSE(h.attempt->done());
  h.clock.advance(9999ms);
  CHECK_FALSE(h.attempt->done());
  h.clock.advance(1ms);  // 10 s after SIGKILL
  h.io.poll();
  CHECK(h.attempt->done());
  CHECK(h.attempt->result().ends.size() == 1);  // it never exited
}

TEST_CASE("output pipes held open by a leftover end the attempt at the drain deadline, not never") {
  Harness h(1);
  h.launcher.hold_streams(0);
  h.start();
  h.launcher.exit(0, exited_with(0));
  h.reap();
  CHECK_FALSE(h.attempt->done());  // draining what the pipes still hold
  h.clock.advance(1999ms);
  h.io.poll();
  CHECK_FALSE(h.attempt->done());
  h.clock.advance(1ms);
  CHECK(h.attempt->done());
  CHECK(h.attempt->result().outcome == ag::Outcome::kSucceeded);
}

TEST_CASE("a leftover that closes the pipes inside the drain deadline ends the attempt at once") {
  Harness h(1);
  h.launcher.hold_streams(0);
  h.start();
  h.launcher.exit(0, exited_with(0));
  h.reap();
  CHECK_FALSE(h.attempt->done());
  h.launcher.drop_streams();
  // The EOFs come through the loop.
  while (!h.attempt->done() && h.io.run_one_for(10s) > 0) {
  }
  CHECK(h.attempt->done());
  CHECK(h.clock.armed_timers() == 0);
}

TEST_CASE("a stop signal is forwarded to every group; a second one kills at once") {
  Harness h(2);
  h.launcher.ignore(0, SIGINT);
  h.launcher.ignore(1, SIGINT);
  h.start();
  h.attempt->interrupt(SIGINT);
  CHECK(h.launcher.signals_to(0) == std::vector<int>{SIGINT, SIGCONT});
  h.clock.advance(1s);
  h.attempt->interrupt(SIGINT);
  CHECK(h.launcher.signals_to(0).back() == SIGKILL);
  CHECK(h.launcher.signals_to(1).back() == SIGKILL);
  h.reap();
  REQUIRE(h.attempt->done());
  CHECK(h.attempt->result().outcome == ag::Outcome::kInterrupted);
  CHECK(h.attempt->result().signal == SIGINT);
  CHECK_FALSE(h.attempt->result().root);
}

TEST_CASE("a hook's failure signals its targets first and waits for them, then tears down") {
  Harness h(3);
  h.launcher.ignore(1, SIGABRT);  // a worker that does not die of its stack dump
  h.start();
  REQUIRE(h.hooks.control);
  ag::FailRequest req;
  req.reason = "hang: rank 1 missed heartbeats";
  req.local_rank = 1;
  req.signal = SIGABRT;
  req.targets = {1};
  req.wait = 2s;
  h.hooks.control->fail_attempt(req);
  CHECK(h.launcher.signals_to(1) == std::vector<int>{SIGABRT});
  CHECK(h.launcher.sent.size() == 1);  // one process, not its group; nobody else yet
  CHECK_FALSE(h.launcher.sent[0].group);
  h.clock.advance(1999ms);
  CHECK(h.launcher.signals_to(0).empty());
  h.clock.advance(1ms);  // the wait is over: the usual teardown
  CHECK(h.launcher.signals_to(0) == std::vector<int>{SIGTERM, SIGCONT});
  h.reap();
  REQUIRE(h.attempt->done());
  CHECK(h.attempt->result().root->reason == "hang: rank 1 missed heartbeats");
}

TEST_CASE("a target that exits on the hook's signal starts the teardown without waiting") {
  Harness h(2);
  h.start();
  ag::FailRequest req;
  req.reason = "hang";
  req.signal = SIGABRT;
  req.targets = {0};
  req.wait = 5s;
  h.hooks.control->fail_attempt(req);
  h.reap();  // rank 0 died of SIGABRT: rank 1 gets SIGTERM now
  CHECK(h.launcher.signals_to(1) == std::vector<int>{SIGTERM, SIGCONT, SIGKILL});
  h.reap();
  CHECK(h.attempt->done());
  CHECK(h.attempt->result().root->reason == "hang");  // not rank 0's SIGABRT
}

TEST_CASE("Ctrl-Z stops every worker group and fg continues them, without ending anything") {
  Harness h(2);
  h.start();
  h.attempt->stop_workers();
  h.attempt->continue_workers();
  CHECK(h.launcher.signals_to(0) == std::vector<int>{SIGSTOP, SIGCONT});
  CHECK(h.launcher.signals_to(1) == std::vector<int>{SIGSTOP, SIGCONT});
  CHECK(h.launcher.alive(0));
  CHECK_FALSE(h.attempt->done());
  h.attempt->interrupt(SIGTERM);
  h.reap();
  CHECK(h.attempt->done());
}

TEST_CASE("continue_running_workers continues the groups of the workers not reaped yet, through the launcher") {
  Harness h(3);
  h.start();
  h.launcher.exit(1, exited_with(0));
  h.reap();
  REQUIRE(h.hooks.control != nullptr);
  h.launcher.sent.clear();
  // A reaped worker's group id may name another process's group by now.
  h.hooks.control->continue_running_workers();
  CHECK(h.launcher.sent ==
        std::vector<ag::test::SentSignal>{{0, SIGCONT, true}, {2, SIGCONT, true}});
}
