// The Watchdog's detectors on a ManualClock (base/clock.h): time moves only
// when the test says, so each deadline is checked to the millisecond and no
// test waits. Beats and output are fed in directly (heartbeat_test.cc and
// the integration tests carry them from real workers); the process-state
// detector reads /proc of real workers, SIGSTOPped or in state D.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <optional>

#include "base/clock.h"
#include "base/steady_clock.h"
#include "tests/watchdog/test_util.h"
#include "watchdog/peer_stall.h"
#include "watchdog/watchdog.h"

namespace wd = ddprun::watchdog;
using namespace std::chrono_literals;
using namespace wd::testing;
using ddprun::base::ManualClock;

namespace {

// Heartbeat and silence tests never read /proc: any pid will do.
constexpr pid_t kPid = 4242;

wd::WatchdogOptions heartbeat_only(wd::Millis timeout, wd::Millis grace) {
  wd::WatchdogOptions opt;
  opt.heartbeat_timeout = timeout;
  opt.heartbeat_grace = grace;
  opt.stuck_timeout = 0ms;
  return opt;
}

// A watchdog on a manual clock that keeps the hang it reports. Tests take
// its parts by name: auto& [clock, hang, dog] = watched;
struct Watched {
  explicit Watched(const wd::WatchdogOptions& opt)
      : dog(clock, opt, [this](const wd::HangEvent& e) { hang = e; }) {}
  ManualClock clock;
  std::optional<wd::HangEvent> hang;
  wd::Watchdog dog;
};

// Blocks until `child` is stopped (SIGSTOP delivered), without reaping it.
void wait_stopped(const Child& child) {
  siginfo_t info{};
  REQUIRE(::waitid(P_PID, static_cast<id_t>(child.pid()), &info, WSTOPPED | WNOWAIT) == 0);
}

// Ranks 0 and 1 on this node, both beating step 1 10 ms in.
void two_ranks_beating(Watched& w) {
  w.dog.add_worker(0, 0, kPid);
  w.dog.add_worker(1, 1, kPid + 1);
  w.clock.advance(10ms);
  w.dog.on_beat(wd::testing::beat(0, 1, w.clock.now()));
  w.dog.on_beat(wd::testing::beat(1, 1, w.clock.now()));
}

}  // namespace

TEST_CASE("heartbeat timeout fires exactly one timeout after the last beat") {
  Watched watched(heartbeat_only(300ms, 10s));
  auto& [clock, hang, dog] = watched;
  dog.add_worker(0, 0, kPid);
  for (int step = 0; step < 5; ++step) {
    clock.advance(10ms);
    dog.on_beat(wd::testing::beat(0, step, clock.now()));
  }
  const auto last = clock.now();
  clock.advance(299ms);
  CHECK_FALSE(hang);
  clock.advance(1ms);
  REQUIRE(hang);
  CHECK(hang->kind == wd::HangKind::kHeartbeat);
  CHECK(hang->global_rank == 0);
  CHECK(hang->pid == kPid);
  CHECK(hang->timeout == 300ms);
  CHECK(hang->due == last + 300ms);
  CHECK(hang->detected == hang->due);
  CHECK(hang->detail == "no heartbeat for 0.30 s (last step 4)");
  CHECK(dog.workers().at(0).beats == 5);
  CHECK(dog.fired());
  CHECK(clock.armed_timers() == 0);  // disarmed once fired
}

TEST_CASE("a worker that never beats misses the first-beat grace") {
  Watched watched(heartbeat_only(100ms, 300ms));
  auto& [clock, hang, dog] = watched;
  dog.add_worker(0, 7, kPid);
  clock.advance(299ms);
  CHECK_FALSE(hang);
  clock.advance(1ms);
  REQUIRE(hang);
  CHECK(hang->kind == wd::HangKind::kHeartbeat);
  CHECK(hang->global_rank == 7);
  CHECK(hang->timeout == 300ms);
  CHECK(hang->due == dog.workers()[0].spawned + 300ms);
  CHECK(hang->detail == "no first heartbeat within the 0.30 s grace after start");
}

TEST_CASE("fixed timeout, --restart-scope=rank: survivors waiting for a replacement that is "
          "still starting are held by its first-beat grace, not one heartbeat timeout") {
  Watched watched(heartbeat_only(300ms, 5s));
  auto& [clock, hang, dog] = watched;
  two_ranks_beating(watched);
  dog.replace_worker(1, kPid + 10);  // rank 1 died; its replacement loads LibTorch
  const auto spawned = clock.now();
  clock.advance(5s - 1ms);
  CHECK_FALSE(hang);  // rank 0 waits in the new generation's rendezvous
  clock.advance(1ms);
  REQUIRE(hang);  // the replacement never beat within its grace: it is the hang
  CHECK(hang->due == spawned + 5s);
}

TEST_CASE("fixed timeout: once the replacement beats, every rank is on the heartbeat timeout "
          "again") {
  Watched watched(heartbeat_only(300ms, 5s));
  auto& [clock, hang, dog] = watched;
  dog.add_worker(0, 0, kPid);
  dog.add_worker(1, 1, kPid + 1);
  dog.on_beat(wd::testing::beat(0, 1, clock.now()));
  dog.on_beat(wd::testing::beat(1, 1, clock.now()));
  dog.replace_worker(1, kPid + 10);
  clock.advance(1s);
  dog.on_beat(wd::testing::beat(0, 2, clock.now()));
  dog.on_beat(wd::testing::beat(1, 2, clock.now()));
  const auto last = clock.now();
  clock.advance(300ms);
  REQUIRE(hang);
  CHECK(hang->due == last + 300ms);
}

TEST_CASE("fixed timeout, --restart-scope=rank: the replacement's first beat gives the survivors "
          "a full timeout from it, however long the recovery took") {
  Watched watched(heartbeat_only(300ms, 5s));
  auto& [clock, hang, dog] = watched;
  two_ranks_beating(watched);
  dog.replace_worker(1, kPid + 10);
  clock.advance(2s);  // a slow recovery: longer than the timeout, within the grace
  CHECK_FALSE(hang);
  dog.on_beat(wd::testing::beat(1, 1, clock.now()));  // the replacement joined and beats
  const auto joined = clock.now();
  clock.advance(299ms);
  CHECK_FALSE(hang);  // rank 0 redoes the step with it
  clock.advance(1ms);
  REQUIRE(hang);
  CHECK(hang->due == joined + 300ms);
}

TEST_CASE("fixed timeout, --restart-scope=rank on several nodes: ranks waiting for another "
          "node's replacement are held by the first-beat grace until they beat again") {
  Watched watched(heartbeat_only(300ms, 5s));
  auto& [clock, hang, dog] = watched;
  two_ranks_beating(watched);
  dog.peer_replacing();  // rank 2, on another node, died; its replacement starts there
  const auto told = clock.now();
  clock.advance(2s);
  CHECK_FALSE(hang);  // both wait in the new generation's rendezvous
  dog.on_beat(wd::testing::beat(0, 2, clock.now()));  // re-formed: rank 0 steps again
  const auto beat = clock.now();
  clock.advance(300ms);
  REQUIRE(hang);  // rank 1 is on the grace still, rank 0 on its timeout again
  CHECK(hang->global_rank == 0);
  CHECK(hang->due == beat + 300ms);
  CHECK(beat + 300ms < told + 5s);
}

TEST_CASE("a first beat ends the grace: the timeout counts from it, not from the grace") {
  Watched watched(heartbeat_only(300ms, 10s));
  auto& [clock, hang, dog] = watched;
  dog.add_worker(0, 0, kPid);
  clock.advance(1s);
  dog.on_beat(wd::testing::beat(0, 1, clock.now()));
  clock.advance(300ms);
  REQUIRE(hang);
  CHECK(hang->due == dog.workers()[0].spawned + 1300ms);
}

TEST_CASE("a worker that beats just inside the timeout is never flagged, and is once it stops") {
  Watched watched(heartbeat_only(1s, 10s));
  auto& [clock, hang, dog] = watched;
  dog.add_worker(0, 0, kPid);
  dog.add_worker(1, 1, kPid + 1);
  for (int step = 0; step < 1000; ++step) {
    clock.advance(999ms);
    dog.on_beat(wd::testing::beat(0, step, clock.now()));
    dog.on_beat(wd::testing::beat(1, step, clock.now()));
  }
  CHECK_FALSE(hang);
  CHECK(dog.workers()[0].step == 999);
  clock.advance(999ms);
  dog.on_beat(wd::testing::beat(0, 1000, clock.now()));  // rank 1 misses this one
  clock.advance(1ms);
  REQUIRE(hang);
  CHECK(hang->global_rank == 1);
  CHECK(dog.suspects(*hang) == std::vector<int>{1});  // behind rank 0's step
}

TEST_CASE("silence timeout fires one timeout after the last output") {
  wd::WatchdogOptions opt;
  opt.silence_timeout = 300ms;
  opt.stuck_timeout = 0ms;
  Watched watched(opt);
  auto& [clock, hang, dog] = watched;
  dog.add_worker(0, 0, kPid);
  clock.advance(50ms);
  dog.on_output(0);
  clock.advance(200ms);
  dog.on_output(0);
  clock.advance(299ms);
  CHECK_FALSE(hang);
  clock.advance(1ms);
  REQUIRE(hang);
  CHECK(hang->kind == wd::HangKind::kSilence);
  CHECK(hang->due == dog.workers()[0].last_output + 300ms);
  CHECK(hang->detail == "no output on stdout or stderr for 0.30 s");
}

TEST_CASE("a quiet start-up is not silence: the timeout arms at the first output, until then the grace") {
  wd::WatchdogOptions opt;
  opt.silence_timeout = 100ms;
  opt.heartbeat_grace = 700ms;  // --heartbeat-grace names the start-up grace
  opt.stuck_timeout = 0ms;
  CHECK(opt.effective_silence_grace() == 700ms);
  Watched watched(opt);
  auto& [clock, hang, dog] = watched;
  dog.add_worker(0, 0, kPid);  // never prints
  clock.advance(699ms);
  CHECK_FALSE(hang);
  clock.advance(1ms);
  REQUIRE(hang);
  CHECK(hang->kind == wd::HangKind::kSilence);
  // Not spawn + 100 ms: the silence timeout had not armed yet.
  CHECK(hang->due == dog.workers()[0].spawned + 700ms);
  CHECK(hang->timeout == 700ms);
  CHECK(hang->detail.find("no first output within the 0.70 s grace") == 0);

  // Once a worker has printed, the timeout itself counts, even inside the
  // grace: the first output moves the deadline earlier.
  Watched talker(opt);
  talker.dog.add_worker(0, 0, kPid);
  talker.dog.on_output(0);
  talker.clock.advance(100ms);
  REQUIRE(talker.hang);
  CHECK(talker.hang->due == talker.dog.workers()[0].spawned + 100ms);
  CHECK(talker.hang->timeout == 100ms);

  // Without --heartbeat-grace the start-up grace is the default, never
  // shorter than the silence timeout itself.
  wd::WatchdogOptions d;
  d.silence_timeout = 3s;
  CHECK(d.effective_silence_grace() == wd::WatchdogOptions::kDefaultGrace);
  d.silence_timeout = 120s;
  CHECK(d.effective_silence_grace() == 120s);
}

TEST_CASE("a deadline seen late: past the pause threshold the agent was paused, up to it the worker hung") {
  wd::WatchdogOptions opt = heartbeat_only(1s, 10s);
  opt.pause_threshold = 1s;
  Watched watched(opt);
  auto& [clock, hang, dog] = watched;
  dog.add_worker(0, 0, kPid);
  dog.on_beat(wd::testing::beat(0, 1, clock.now()));
  const auto beat = clock.now();
  SUBCASE("4 s late: the deadlines restart instead of blaming the worker") {
    // The agent was stopped, so the beats the worker sent meanwhile were
    // never read.
    clock.jump(5s);
    CHECK_FALSE(hang);
    CHECK(dog.pauses() == 1);
    CHECK(dog.paused_for() == 4s);
    const auto resumed = clock.now();
    clock.advance(999ms);
    CHECK_FALSE(hang);
    clock.advance(1ms);
    REQUIRE(hang);
    CHECK(hang->due == resumed + 1s);
  }
  SUBCASE("1 s late, the threshold itself: a hang") {
    clock.jump(2s);
    REQUIRE(hang);
    CHECK(dog.pauses() == 0);
    CHECK(hang->due == beat + 1s);
    CHECK(hang->detected == beat + 2s);
  }
}

TEST_CASE("stop() disarms every detector") {
  Watched watched(heartbeat_only(100ms, 100ms));
  auto& [clock, hang, dog] = watched;
  dog.add_worker(0, 0, kPid);
  dog.stop();
  CHECK(clock.armed_timers() == 0);
  clock.advance(1h);
  CHECK_FALSE(hang);
}

TEST_CASE("a reported hang watches again from the next beat: no deadline before it, a full timeout after") {
  Watched watched(heartbeat_only(100ms, 100ms));
  auto& [clock, hang, dog] = watched;
  two_ranks_beating(watched);
  clock.advance(100ms);
  REQUIRE(hang);
  CHECK(dog.fired());
  hang.reset();
  dog.rearm_after_report();
  CHECK_FALSE(dog.fired());
  clock.advance(1h);  // the ranks stay silent: the same stall is not reported again
  CHECK_FALSE(hang);
  dog.on_beat(wd::testing::beat(0, 2, clock.now()));
  const auto resumed = clock.now();
  clock.advance(100ms - 1ms);
  CHECK_FALSE(hang);
  clock.advance(1ms);
  REQUIRE(hang);
  CHECK(hang->due == resumed + 100ms);
}

TEST_CASE("a watchdog stopped while its hang was being reported stays stopped") {
  Watched watched(heartbeat_only(100ms, 100ms));
  auto& [clock, hang, dog] = watched;
  two_ranks_beating(watched);
  clock.advance(100ms);
  REQUIRE(hang);
  hang.reset();
  dog.stop();  // the attempt ended during the report's stack capture
  dog.rearm_after_report();
  dog.on_beat(wd::testing::beat(0, 2, clock.now()));
  clock.advance(1h);
  CHECK_FALSE(hang);
}

TEST_CASE("a SIGSTOPped worker is detected from its process state at the first poll past the limit") {
  wd::WatchdogOptions opt;
  opt.stuck_timeout = 200ms;
  opt.proc_poll_interval = 100ms;
  Watched watched(opt);
  auto& [clock, hang, dog] = watched;
  Child child({WATCHDOG_TEST_WORKER, "hang"}, {}, true);
  REQUIRE(child.wait_for_output("ready"));
  REQUIRE(::kill(child.pid(), SIGSTOP) == 0);
  wait_stopped(child);
  dog.add_worker(0, 2, child.pid());
  const auto t0 = clock.now();
  clock.advance(299ms);  // polls at 100 ms (stuck from here) and 200 ms
  CHECK_FALSE(hang);
  clock.advance(1ms);  // the poll at 300 ms: stuck for 200 ms
  REQUIRE(hang);
  CHECK(hang->kind == wd::HangKind::kStopped);
  CHECK(hang->global_rank == 2);
  CHECK(hang->due == t0 + 300ms);
  CHECK(hang->detected == hang->due);
  CHECK(dog.workers()[0].proc_state == 'T');
}

TEST_CASE("after a reported silence the process-state detector watches on: a worker stopped "
          "later is caught") {
  wd::WatchdogOptions opt;
  opt.silence_timeout = 1000ms;
  opt.heartbeat_grace = 1000ms;
  opt.stuck_timeout = 200ms;
  opt.proc_poll_interval = 100ms;
  Watched watched(opt);
  auto& [clock, hang, dog] = watched;
  Child child({WATCHDOG_TEST_WORKER, "hang"}, {}, true);
  REQUIRE(child.wait_for_output("ready"));
  dog.add_worker(0, 1, child.pid());
  clock.advance(1000ms);  // asleep (S), silent: the silence fires while a poll is pending
  REQUIRE(hang);
  CHECK(hang->kind == wd::HangKind::kSilence);
  hang.reset();
  dog.rearm_after_report();  // --on-hang=report, ddprun attach --on-hang nothing
  dog.on_output(0);          // it makes progress again, then is stopped
  REQUIRE(::kill(child.pid(), SIGSTOP) == 0);
  wait_stopped(child);
  clock.advance(300ms);  // polls at 100 ms (stuck from here), 200, 300 ms
  REQUIRE(hang);
  CHECK(hang->kind == wd::HangKind::kStopped);
}

// ThreadSanitizer's vfork interceptor turns the worker's vfork() into a
// fork(), so under TSan its parent never enters state D: the case cannot run
// there and is reported skipped (the plain and ASan builds run it).
#if defined(__SANITIZE_THREAD__)
constexpr bool kNoVforkDState = true;
#else
constexpr bool kNoVforkDState = false;
#endif

TEST_CASE("a worker in uninterruptible sleep (D) is detected from its process state" *
          doctest::skip(kNoVforkDState)) {
  // Real time: the worker reaches state D some moment after "ready".
  boost::asio::io_context io;
  ddprun::base::SteadyClock clock(io);
  wd::WatchdogOptions opt;
  opt.stuck_timeout = 200ms;
  std::optional<wd::HangEvent> hang;
  wd::Watchdog dog(clock, opt, [&](const wd::HangEvent& e) { hang = e; });
  Child child({WATCHDOG_TEST_WORKER, "dstate"}, {}, true);
  REQUIRE(child.wait_for_output("ready"));
  dog.add_worker(0, 0, child.pid());
  REQUIRE(run_until(io, [&] { return hang.has_value(); }));
  CHECK(hang->kind == wd::HangKind::kUninterruptible);
  CHECK(hang->detail.find("uninterruptible") != std::string::npos);
  CHECK(dog.workers()[0].proc_state == 'D');
}

TEST_CASE("a sleeping (S) worker is not stuck, and an exited worker is not watched") {
  wd::WatchdogOptions opt;
  opt.stuck_timeout = 100ms;
  opt.heartbeat_timeout = 100ms;
  opt.heartbeat_grace = 100ms;
  Watched watched(opt);
  auto& [clock, hang, dog] = watched;
  Child sleeper({WATCHDOG_TEST_WORKER, "hang"}, {}, true);
  REQUIRE(sleeper.wait_for_output("ready"));
  dog.add_worker(0, 0, sleeper.pid());
  dog.on_worker_exit(0);  // as if it had finished: no deadline applies
  Child stopped({WATCHDOG_TEST_WORKER, "hang"}, {}, true);
  REQUIRE(stopped.wait_for_output("ready"));
  REQUIRE(::kill(stopped.pid(), SIGSTOP) == 0);
  wait_stopped(stopped);
  dog.add_worker(1, 1, stopped.pid());
  dog.on_beat(wd::testing::beat(1, 3, clock.now()));
  clock.advance(1s);
  REQUIRE(hang);
  CHECK(hang->global_rank == 1);  // never the exited rank 0
}

TEST_CASE("laggard rule names the rank whose step is behind") {
  Watched watched(heartbeat_only(200ms, 10s));
  auto& [clock, hang, dog] = watched;
  dog.add_worker(0, 0, kPid);
  dog.add_worker(1, 1, kPid + 1);
  dog.add_worker(2, 2, kPid + 2);
  // Ranks 0 and 2 reached step 11 and wait in the collective; rank 1 is
  // stuck in step 10. Rank 0's beat is the oldest, so it times out first.
  dog.on_beat(wd::testing::beat(0, 11, clock.now()));
  clock.advance(50ms);
  dog.on_beat(wd::testing::beat(1, 10, clock.now()));
  dog.on_beat(wd::testing::beat(2, 11, clock.now()));
  clock.advance(150ms);
  REQUIRE(hang);
  CHECK(hang->global_rank == 0);
  CHECK(dog.suspects(*hang) == std::vector<int>{1});
  CHECK(dog.max_step() == 11);
}

TEST_CASE("rank scope on several nodes: another node's stall names the rank here behind it; "
          "blame() fires on it at once, withdraw() watches again") {
  Watched w(heartbeat_only(60s, 60s));
  auto& [clock, hang, dog] = w;
  two_ranks_beating(w);  // both at step 1
  clock.advance(10ms);
  dog.on_beat(wd::testing::beat(0, 2, clock.now()));  // rank 0 goes on; rank 1 stops at step 1
  clock.advance(2s);
  // The other node's rank waits at step 2, silent for 2 s there.
  const wd::PeerStall stall{5, 2, 2000ms};
  CHECK(wd::local_ranks_behind(dog.workers(), stall, clock.now()) == std::vector<int>{1});
  // Not behind: the same step, or moving (silent far less than the peer).
  CHECK(wd::local_ranks_behind(dog.workers(), wd::PeerStall{5, 1, 2000ms}, clock.now()).empty());
  CHECK(wd::local_ranks_behind(dog.workers(), wd::PeerStall{5, 3, 10000ms}, clock.now()).empty());
  CHECK(wd::silent_for(dog.workers()[1], clock.now()) == 2010ms);

  dog.blame(1, 0, "behind node 0's stalled ranks");
  REQUIRE(hang);
  CHECK(hang->global_rank == 1);
  CHECK(hang->peer_node == 0);
  CHECK(hang->kind == wd::HangKind::kHeartbeat);
  CHECK(hang->detail == "behind node 0's stalled ranks");
  CHECK(dog.fired());
  hang.reset();
  dog.blame(0, 0, "again");  // fired already: nothing
  CHECK_FALSE(hang);

  // Withdrawn: every deadline counts from now, a full timeout.
  dog.withdraw();
  CHECK_FALSE(dog.fired());
  clock.advance(59s);
  CHECK_FALSE(hang);
  clock.advance(2s);
  REQUIRE(hang);
}
