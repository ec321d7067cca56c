// attach's hang decisions are watchdog/'s: AttachWatch (introspect/
// attach_watch.h) on a ManualClock watching real processes (/bin/sleep
// under /bin/sh: no CPU, no I/O). Time moves only when the test says, so
// each deadline is checked to the millisecond and nothing waits; /proc is
// the real one. The culprit is compared with what the agent's own Watchdog
// names when fed the same beats.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <optional>

#include "base/clock.h"
#include "introspect/attach_watch.h"
#include "introspect/proc_usage.h"
#include "tests/agent/ddprun_process.h"
#include "tests/common/temp_dir.h"

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

// Only the beats can tell a hang: a 1 s heartbeat deadline, no silence or
// stopped-state detector within the test, /proc sampled every 200 ms.
AttachOptions beats_only(pid_t root) {
  AttachOptions o;
  o.pids = {root};
  o.silence_timeout = 600000ms;
  o.stuck_timeout = 0ms;
  o.heartbeat_socket = "not bound by AttachWatch";  // beats on: they come through on_beat
  o.heartbeat_timeout = 1000ms;
  o.poll_interval = 200ms;
  return o;
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
  AttachOptions o = beats_only(shell.pid());
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

TEST_CASE("attach detectors: the beat of a rank that started after the last sample is not "
          "lost: it samples at once, so the rank is judged (and blamed) from that beat") {
  // A clean-clone CI run failed introspect.attach so: rank 1 started after
  // attach's first sample and beat once before the next; the beat was
  // dropped and rank 1, behind in steps, could not be named the culprit.
  DdprunProcess shell({"-c", "sleep 600 & wait"}, {}, "/bin/sh", /*own_group=*/true);
  GroupKiller kill_group{shell.pid()};
  ManualClock clock;
  AttachOptions o = beats_only(shell.pid());
  std::optional<AttachWatch::Hang> hang;
  AttachWatch watch(clock, o, [&](const AttachWatch::Hang& h) { hang = h; }, [] {});
  const auto with_rank = [&] {
    return std::count_if(watch.ranks().begin(), watch.ranks().end(),
                         [](const auto& r) { return r.second.rank >= 0; });
  };
  watch.start();
  CHECK(with_rank() == 0);  // the sleep has no RANK

  // Ranks 0 and 1 start now, between two samples (no time passes).
  DdprunProcess ranks({"-c", shell_for(2)}, {}, "/bin/sh", /*own_group=*/true);
  GroupKiller kill_ranks{ranks.pid()};
  sleeping_ranks(ranks, 2);
  o.pids.push_back(ranks.pid());  // the roots are read at each sample
  watch.on_beat(beat(0, 5, clock.now()));
  CHECK(with_rank() == 2);  // sampled at the unknown beat
  clock.advance(100ms);
  watch.on_beat(beat(1, 4, clock.now()));  // known now: no second scan
  clock.advance(900ms);
  REQUIRE(hang);
  CHECK(hang->event.global_rank == 0);
  const auto report = watch.report(*hang);
  CHECK(report.culprit == 1);
  CHECK(report.suspects == std::vector<int>{1});
}

TEST_CASE("attach detectors: a process first seen before it exec'd with RANK is watched "
          "under its rank once it has, and its beats count") {
  // The watched root is a shell with no RANK that, once told, execs a
  // program with RANK=3 (same pid): what a sample between a launcher's fork
  // and exec sees. A loaded run of introspect.attach kept such a rank at -1
  // and never matched its beats.
  ddprun::testing::TempDir dir;
  const std::string go = dir.file("go");
  REQUIRE(::mkfifo(go.c_str(), 0600) == 0);
  DdprunProcess root({"-c", "read x < \"$0\"; exec env RANK=3 sleep 600", go}, {}, "/bin/sh",
                     /*own_group=*/true);
  GroupKiller kill_group{root.pid()};
  ManualClock clock;
  AttachOptions o = beats_only(root.pid());
  std::optional<AttachWatch::Hang> hang;
  AttachWatch watch(clock, o, [&](const AttachWatch::Hang& h) { hang = h; }, [] {});
  watch.start();
  REQUIRE(watch.ranks().count(root.pid()) == 1);
  CHECK(watch.ranks().at(root.pid()).rank == -1);

  std::ofstream(go) << "exec\n";  // opens once the shell reads: it is waiting
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (ddprun::introspect::proc_environ_value(root.pid(), "RANK") != "3" &&
         std::chrono::steady_clock::now() < deadline) {
  }
  REQUIRE(ddprun::introspect::proc_environ_value(root.pid(), "RANK") == "3");
  watch.on_beat(beat(3, 7, clock.now()));  // unknown rank: samples, finds it
  CHECK(watch.ranks().at(root.pid()).rank == 3);
  clock.advance(999ms);
  CHECK_FALSE(hang);
  clock.advance(1ms);
  REQUIRE(hang);
  CHECK(hang->event.global_rank == 3);
  CHECK(hang->attach_kind == "heartbeat_timeout");
}
