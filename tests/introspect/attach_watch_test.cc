// attach's hang decisions are watchdog/'s: AttachWatch (introspect/
// attach_watch.h) on a ManualClock watching real processes (/bin/sleep
// under /bin/sh: no CPU, no I/O). Time moves only when the test says, so
// each deadline is checked to the millisecond and nothing waits; /proc is
// the real one. The culprit is compared with what the agent's own Watchdog
// names when fed the same beats.
#include <doctest/doctest.h>
#include <signal.h>

#include <optional>

#include "base/clock.h"
#include "introspect/attach_watch.h"
#include "introspect/proc_usage.h"
#include "tests/agent/ddprun_process.h"

namespace {

namespace wd = ddprun::watchdog;
using namespace std::chrono_literals;
using ddprun::base::ManualClock;
using ddprun::introspect::AttachOptions;
using ddprun::introspect::AttachWatch;
using ddprun::testing::DdprunProcess;

// SIGKILLs the shell's group when the test ends, whatever happened.
struct GroupKiller {
  pid_t pgid;
  ~GroupKiller() { ::kill(-pgid, SIGKILL); }
};

// A shell running `ranks` sleeping ranks (RANK=0..n-1), in a group of its
// own; returns their pids by rank once each has exec'd sleep (its environ
// carries RANK, and it sleeps: from then on it uses no CPU).
std::vector<pid_t> sleeping_ranks(DdprunProcess& shell, int ranks) {
  std::vector<pid_t> pids(static_cast<std::size_t>(ranks), 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (bool all = false; !all && std::chrono::steady_clock::now() < deadline;) {
    all = true;
    for (pid_t p : ddprun::introspect::child_pids(shell.pid())) {
      const auto rank = ddprun::introspect::proc_environ_value(p, "RANK");
      const auto u = ddprun::introspect::read_proc_usage(p);
      if (rank && u && u->state == 'S') pids.at(std::stoul(*rank)) = p;
    }
    for (pid_t p : pids) all = all && p > 0;
  }
  for (pid_t p : pids) REQUIRE(p > 0);
  return pids;
}

std::string shell_for(int ranks) {
  std::string s;
  for (int r = 0; r < ranks; ++r) s += "RANK=" + std::to_string(r) + " sleep 600 & ";
  return s + "wait";
}

wd::Beat beat(int rank, int64_t step, ddprun::base::TimePoint at) {
  wd::Beat b;
  b.global_rank = rank;
  b.step = step;
  b.received = at;
  return b;
}

}  // namespace

TEST_CASE("attach detectors: no CPU and no I/O is the watchdog's silence, due exactly "
          "--silence-timeout after attach first saw the rank") {
  DdprunProcess shell({"-c", shell_for(1)}, {}, "/bin/sh", /*own_group=*/true);
  GroupKiller kill_group{shell.pid()};
  const pid_t rank0 = sleeping_ranks(shell, 1).at(0);
  ManualClock clock;
  AttachOptions o;
  o.pids = {shell.pid()};
  o.silence_timeout = 2000ms;
  o.stuck_timeout = 0ms;
  o.poll_interval = 200ms;
  std::optional<AttachWatch::Hang> hang;
  bool ended = false;
  AttachWatch watch(clock, o, [&](const AttachWatch::Hang& h) { hang = h; }, [&] { ended = true; });
  const auto seen = clock.now();
  watch.start();
  clock.advance(1999ms);
  CHECK_FALSE(hang);
  clock.advance(1ms);
  REQUIRE(hang);
  CHECK(hang->event.kind == wd::HangKind::kSilence);
  CHECK(hang->attach_kind == "no_progress");
  CHECK(hang->event.global_rank == 0);
  CHECK(hang->event.pid == rank0);
  CHECK(hang->event.due == seen + 2000ms);
  CHECK(hang->event.detected == hang->event.due);
  CHECK(hang->event.detail == "no CPU time and no I/O for 2.0 s (state S)");
  const auto report = watch.report(*hang);
  CHECK(report.culprit == 0);
  CHECK(report.to_json()["kind"] == "silence_timeout");
  CHECK_FALSE(ended);
}

TEST_CASE("attach detectors: the culprit of a missed beat is the one the agent's watchdog "
          "names (the rank behind in steps), and a rank that never beat is not judged") {
  // Ranks 0 and 1 beat, rank 2 never does (attach watches programs it did
  // not start: not every rank beats).
  DdprunProcess shell({"-c", shell_for(3)}, {}, "/bin/sh", /*own_group=*/true);
  GroupKiller kill_group{shell.pid()};
  const auto pids = sleeping_ranks(shell, 3);
  ManualClock clock;
  AttachOptions o;
  o.pids = {shell.pid()};
  o.silence_timeout = 600000ms;  // only the beats can tell
  o.stuck_timeout = 0ms;
  o.heartbeat_socket = "not bound by AttachWatch";  // beats on: they come through on_beat
  o.heartbeat_timeout = 1000ms;
  o.poll_interval = 200ms;
  std::optional<AttachWatch::Hang> hang;
  AttachWatch watch(clock, o, [&](const AttachWatch::Hang& h) { hang = h; }, [] {});
  watch.start();

  // The agent's watchdog in the same situation: ranks 0 and 1 (under the
  // agent with --heartbeat-timeout every rank must beat, so a rank 2 that
  // never does would be blamed there for that).
  ManualClock agent_clock;
  wd::WatchdogOptions agent_options;
  agent_options.heartbeat_timeout = 1000ms;
  agent_options.heartbeat_grace = 600000ms;
  agent_options.stuck_timeout = 0ms;
  std::optional<wd::HangEvent> agent_hang;
  wd::Watchdog agent(agent_clock, agent_options, [&](const wd::HangEvent& e) { agent_hang = e; });
  for (int r = 0; r < 2; ++r) agent.add_worker(r, r, pids.at(static_cast<std::size_t>(r)));

  // Rank 0 beats step 5 and stops; 100 ms later rank 1 beats step 4 and
  // stops: rank 0's deadline passes first, but rank 1 is behind.
  watch.on_beat(beat(0, 5, clock.now()));
  agent.on_beat(beat(0, 5, agent_clock.now()));
  clock.advance(100ms);
  agent_clock.advance(100ms);
  watch.on_beat(beat(1, 4, clock.now()));
  agent.on_beat(beat(1, 4, agent_clock.now()));
  clock.advance(899ms);
  CHECK_FALSE(hang);
  clock.advance(1ms);
  agent_clock.advance(900ms);
  REQUIRE(hang);
  REQUIRE(agent_hang);
  CHECK(hang->event.kind == wd::HangKind::kHeartbeat);
  CHECK(hang->attach_kind == "heartbeat_timeout");
  CHECK(hang->event.global_rank == 0);
  CHECK(hang->event.detail == agent_hang->detail);
  const auto report = watch.report(*hang);
  const auto agent_report = wd::make_hang_report(agent, *agent_hang, 0);
  CHECK(report.culprit == 1);
  CHECK(agent_report.culprit == 1);
  CHECK(report.stalled == agent_report.stalled);
  CHECK(report.suspects == agent_report.suspects);
  // Rank 2, which never beat, is neither stalled nor suspected.
  CHECK(report.stalled == std::vector<int>{0});
  CHECK(report.suspects == std::vector<int>{1});
  CHECK(report.workers.size() == 3);
}
