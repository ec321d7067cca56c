// RankRecovery (rank_recovery.h) alone, on a fake RecoveryHost and a
// ManualClock: which packets reach the workers, which slots are signalled
// or replaced, and when the recovery gives up (and whether it stops the
// group itself or leaves that to the caller). attempt_recovery_test.cc
// covers the same protocol through Attempt; here nothing is spawned.
#include <doctest/doctest.h>
#include <errno.h>
#include <signal.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "agent/rank_recovery.h"
#include "base/clock.h"
#include "rendezvous/store.h"

namespace ag = ddprun::agent;
using namespace std::chrono_literals;
using Kind = ag::RecoveryEvent::Kind;

namespace {

struct Told {
  std::string packet;
  int except;
};

struct Signalled {
  int local_rank;
  int sig;
  bool group;
  bool operator==(const Signalled& o) const {
    return local_rank == o.local_rank && sig == o.sig && group == o.group;
  }
};

// The workers as the recovery sees them: slots with a pid and a liveness,
// and a log of every call. A replacement gets the next pid.
struct FakeRecoveryHost : ag::RecoveryHost {
  struct Slot {
    ag::WorkerInfo info;
    bool alive = true;
  };
  std::vector<Slot> slots;
  bool group_running = true;
  pid_t next_pid = 1000;
  // The next replace_slot fails with this; a standby's number otherwise.
  std::optional<ag::SpawnError> replace_error;
  int standby = 0;

  std::vector<Told> told;
  std::vector<Signalled> signals;
  std::vector<std::pair<int, int>> replaced;  // local rank, generation
  std::vector<ag::Failure> stopped;
  int over = 0;

  explicit FakeRecoveryHost(int n) {
    for (int lr = 0; lr < n; ++lr) {
      Slot s;
      s.info.local_rank = lr;
      s.info.rank = lr;
      s.info.pid = 100 + lr;
      slots.push_back(s);
    }
  }
  // The worker in `lr` ended as `status` (the host marks it reaped).
  ag::WorkerEnd end(int lr, ag::ExitStatus status) {
    slots[lr].alive = false;
    return {slots[lr].info, status, ag::Clock::now()};
  }
  // Packets told, one a line, as "<except>: <packet>"; cleared.
  std::string take_told() {
    std::string out;
    for (const auto& t : told) out += std::to_string(t.except) + ": " + t.packet + "\n";
    told.clear();
    return out;
  }

  bool running() const override { return group_running; }
  int slot_count() const override { return static_cast<int>(slots.size()); }
  const ag::WorkerInfo& slot(int lr) const override { return slots[lr].info; }
  bool slot_alive(int lr) const override { return slots[lr].alive; }
  void signal_slot(int lr, int sig, bool whole_group) override {
    signals.push_back({lr, sig, whole_group});
  }
  Replaced replace_slot(int lr, int generation) override {
    replaced.emplace_back(lr, generation);
    Replaced r;
    if (replace_error) {
      r.error = replace_error;
      return r;
    }
    slots[lr].info.pid = next_pid++;
    slots[lr].alive = true;
    r.standby = standby;
    return r;
  }
  void tell_workers(const std::string& packet, int except) override {
    told.push_back({packet, except});
  }
  void stop_group(ag::Failure root) override {
    group_running = false;
    stopped.push_back(std::move(root));
  }
  void recovery_over() override { ++over; }
};

struct Events : ag::AgentHooks {
  std::vector<ag::RecoveryEvent> got;
  void recovery(const ag::RecoveryEvent& e) override { got.push_back(e); }
  std::vector<Kind> kinds() const {
    std::vector<Kind> k;
    for (const auto& e : got) k.push_back(e.kind);
    return k;
  }
};

// One RankRecovery of `workers` single-node slots, rank scope, `restarts`
// of --max-restarts, a 10 s --recovery-timeout.
struct Fixture {
  explicit Fixture(int workers, int restarts = 2,
                   const std::function<void(ag::Options&, ag::RecoveryPlace&)>& tweak = {})
      : host(workers) {
    options.restart_scope = ag::RestartScope::kRank;
    options.max_restarts = restarts;
    options.recovery_timeout = std::chrono::seconds(10);
    ag::RecoveryPlace place;
    place.run_id = "unit";
    if (tweak) tweak(options, place);
    recovery.emplace(host, clock, options, place, std::vector<ag::AgentHooks*>{&events}, io);
    recovery->start();
  }
  void joined(int lr, int generation) {
    recovery->on_packet(lr, "event=joined generation=" + std::to_string(generation) +
                                " rank=" + std::to_string(lr));
  }

  boost::asio::io_context io;
  ddprun::base::ManualClock clock;
  ag::Options options;
  FakeRecoveryHost host;
  Events events;
  std::optional<ag::RankRecovery> recovery;
};

}  // namespace

TEST_CASE("rank recovery: a failed rank's slot is replaced in a new generation; the survivors hear failed, then ready") {
  Fixture f(3);
  f.host.standby = 2;
  CHECK(f.recovery->on_exit(f.host.end(1, ag::ExitStatus::exited(3))));
  CHECK(f.recovery->under_way());
  CHECK(f.recovery->generation() == 1);
  CHECK(f.recovery->rank_restarts() == 1);
  CHECK(f.recovery->restarts_left() == 1);
  CHECK(f.host.replaced == std::vector<std::pair<int, int>>{{1, 1}});
  CHECK(f.host.take_told() ==
        "1: event=failed generation=1 ranks=1 cause=exit\n"
        "1: event=ready generation=1 ranks=1\n");
  CHECK(f.host.signals.empty());  // replace_slot kills the old group itself
  CHECK(f.host.stopped.empty());
  REQUIRE(f.events.kinds() == std::vector<Kind>{Kind::kFailed, Kind::kReplaced});
  const auto& r = f.events.got[1];
  CHECK(r.standby == 2);
  CHECK(r.replaced->pid == 101);
  CHECK(r.replacement->pid == 1000);
  CHECK(r.restarts_left == 1);
}

TEST_CASE("rank recovery: once every live rank joined the generation, every rank hears recovered") {
  Fixture f(3);
  REQUIRE(f.recovery->on_exit(f.host.end(2, ag::ExitStatus::killed(SIGSEGV))));
  f.host.told.clear();
  f.joined(0, 1);
  f.joined(1, 0);  // an old generation: ignored
  f.recovery->on_packet(1, "event=joined generation=x");  // malformed: ignored
  f.recovery->on_packet(1, "event=ready generation=1");   // not the worker's to send
  f.joined(1, 1);
  CHECK(f.recovery->under_way());
  CHECK(f.host.told.empty());
  CHECK(f.host.over == 0);
  f.joined(2, 1);  // the replacement
  CHECK_FALSE(f.recovery->under_way());
  CHECK(f.host.take_told() == "-1: event=recovered generation=1 ranks=2\n");
  CHECK(f.host.over == 1);
  CHECK(f.events.kinds() == std::vector<Kind>{Kind::kFailed, Kind::kReplaced, Kind::kJoined});
  // The timeout was cancelled with it.
  CHECK(f.clock.armed_timers() == 0);
  f.clock.advance(1h);
  CHECK(f.host.stopped.empty());
}

TEST_CASE("rank recovery: a rank that ended successfully meanwhile is not waited for") {
  Fixture f(3);
  REQUIRE(f.recovery->on_exit(f.host.end(0, ag::ExitStatus::exited(1))));
  CHECK_FALSE(f.recovery->on_exit(f.host.end(2, ag::ExitStatus::exited(0))));
  CHECK(f.recovery->under_way());
  f.joined(0, 1);
  f.joined(1, 1);
  CHECK_FALSE(f.recovery->under_way());
  CHECK(f.host.over == 1);
}

TEST_CASE("rank recovery: a second failure during a recovery falls back; the caller stops the group") {
  Fixture f(3);
  REQUIRE(f.recovery->on_exit(f.host.end(1, ag::ExitStatus::exited(1))));
  f.host.told.clear();
  CHECK_FALSE(f.recovery->on_exit(f.host.end(0, ag::ExitStatus::exited(1))));
  CHECK_FALSE(f.recovery->under_way());
  CHECK(f.host.take_told() == "-1: event=fallback reason=second_failure\n");
  CHECK(f.host.stopped.empty());  // on_exit's false: the group path is the caller's
  CHECK(f.host.replaced.size() == 1);
  REQUIRE(f.events.got.back().kind == Kind::kFallback);
  CHECK(f.events.got.back().reason == "second_failure");
  CHECK(f.events.got.back().generation == 1);
  CHECK(f.clock.armed_timers() == 0);
}

TEST_CASE("rank recovery: a generation that does not form within --recovery-timeout stops the group") {
  Fixture f(3);
  REQUIRE(f.recovery->on_exit(f.host.end(1, ag::ExitStatus::exited(1))));
  f.joined(1, 1);
  f.host.told.clear();
  f.clock.advance(9999ms);
  CHECK(f.host.stopped.empty());
  f.clock.advance(1ms);
  CHECK_FALSE(f.recovery->under_way());
  CHECK(f.host.take_told() == "-1: event=fallback reason=timeout\n");
  REQUIRE(f.host.stopped.size() == 1);
  CHECK(f.host.stopped[0].reason ==
        "rank-scoped recovery failed: generation 1 did not form within --recovery-timeout=10 s "
        "(not joined: rank 0,2)");
  CHECK(f.host.stopped[0].exit_code == 1);
  CHECK(f.events.got.back().reason == "timeout");
}

TEST_CASE("rank recovery: no restart left, or a --no-restart-exit-codes code, takes the group path") {
  SUBCASE("no restart left") {
    Fixture f(2, 0);
    CHECK_FALSE(f.recovery->on_exit(f.host.end(1, ag::ExitStatus::exited(1))));
    CHECK(f.host.take_told() == "-1: event=fallback reason=no_restart_left\n");
    CHECK(f.recovery->generation() == 0);
    CHECK(f.recovery->rank_restarts() == 0);
    CHECK(f.host.replaced.empty());
    CHECK(f.host.stopped.empty());
  }
  SUBCASE("restarts spent by earlier attempts count") {
    Fixture f(2, 3, [](ag::Options&, ag::RecoveryPlace& p) {
      p.restart_count = 2;
      p.rank_restarts = 1;
    });
    CHECK(f.recovery->restarts_left() == 0);
    CHECK_FALSE(f.recovery->on_exit(f.host.end(0, ag::ExitStatus::killed(SIGKILL))));
    CHECK(f.events.got.back().reason == "no_restart_left");
  }
  SUBCASE("a listed exit code; a signal with that number is not one") {
    Fixture f(2, 2, [](ag::Options& o, ag::RecoveryPlace&) { o.no_restart_exit_codes = {9}; });
    CHECK(f.recovery->on_exit(f.host.end(0, ag::ExitStatus::killed(9))));
    f.joined(0, 1);
    f.joined(1, 1);
    REQUIRE_FALSE(f.recovery->under_way());
    f.host.told.clear();
    CHECK_FALSE(f.recovery->on_exit(f.host.end(1, ag::ExitStatus::exited(9))));
    CHECK(f.host.take_told() == "-1: event=fallback reason=no_restart_exit_code\n");
    CHECK(f.host.replaced.size() == 1);
  }
  SUBCASE("group scope: never recovery's") {
    Fixture f(2, 2, [](ag::Options& o, ag::RecoveryPlace&) {
      o.restart_scope = ag::RestartScope::kGroup;
    });
    CHECK_FALSE(f.recovery->on_exit(f.host.end(1, ag::ExitStatus::exited(1))));
    CHECK(f.host.told.empty());
    CHECK(f.events.got.empty());
  }
}

TEST_CASE("rank recovery: a replacement that cannot start stops the group, blaming the first failure") {
  Fixture f(2);
  f.host.replace_error =
      ag::SpawnError("cannot execute 'x': No such file or directory", ENOENT, true);
  CHECK(f.recovery->on_exit(f.host.end(1, ag::ExitStatus::exited(4))));
  CHECK_FALSE(f.recovery->under_way());
  CHECK(f.host.take_told() ==
        "1: event=failed generation=1 ranks=1 cause=exit\n"
        "-1: event=fallback reason=spawn_failed\n");
  REQUIRE(f.host.stopped.size() == 1);
  CHECK(f.host.stopped[0].local_rank == 1);
  CHECK(f.host.stopped[0].status->code == 4);
  CHECK(f.host.stopped[0].exit_code == 4);
  CHECK(f.events.kinds() == std::vector<Kind>{Kind::kFailed, Kind::kFallback});
  CHECK(f.clock.armed_timers() == 0);
}

TEST_CASE("rank recovery: a hang's culprit gets its traceback signal, SIGKILL after the wait, then a successor") {
  Fixture f(2);
  ag::FailRequest req;
  req.reason = "hang: rank 1 missed heartbeats";
  req.replace_local_rank = 1;
  req.signal = SIGABRT;
  req.targets = {1};
  req.wait = 3000ms;
  REQUIRE(f.recovery->on_hang(req));
  CHECK(f.recovery->generation() == 1);
  CHECK(f.host.take_told() == "1: event=failed generation=1 ranks=1 cause=hang\n");
  CHECK(f.host.signals == std::vector<Signalled>{{1, SIGABRT, false}, {1, SIGCONT, true}});
  CHECK(f.host.replaced.empty());  // not before it is reaped
  f.clock.advance(3000ms);
  CHECK(f.host.signals.back() == Signalled{1, SIGKILL, true});
  CHECK(f.recovery->on_exit(f.host.end(1, ag::ExitStatus::killed(SIGKILL))));
  CHECK(f.host.replaced == std::vector<std::pair<int, int>>{{1, 1}});
  CHECK(f.host.take_told() == "1: event=ready generation=1 ranks=1\n");
  f.joined(0, 1);
  f.joined(1, 1);
  CHECK(f.host.take_told() == "-1: event=recovered generation=1 ranks=1\n");
  CHECK(f.events.got[0].cause == "hang");
}

TEST_CASE("rank recovery: a hang without a traceback is SIGKILLed at once; a dead or unknown slot is not recovery's") {
  Fixture f(2);
  ag::FailRequest req;
  req.replace_local_rank = 5;
  CHECK_FALSE(f.recovery->on_hang(req));
  f.host.slots[0].alive = false;
  req.replace_local_rank = 0;
  CHECK_FALSE(f.recovery->on_hang(req));
  CHECK(f.host.signals.empty());
  req.replace_local_rank = 1;
  req.signal = SIGABRT;
  req.targets = {0};  // not the culprit: no traceback asked of it
  REQUIRE(f.recovery->on_hang(req));
  CHECK(f.host.signals == std::vector<Signalled>{{1, SIGKILL, true}});
  CHECK(f.clock.armed_timers() == 1);  // --recovery-timeout only
}

TEST_CASE("rank recovery: the group stopping for another reason ends the recovery without stopping it again") {
  Fixture f(2);
  REQUIRE(f.recovery->on_exit(f.host.end(0, ag::ExitStatus::exited(1))));
  f.host.told.clear();
  f.recovery->group_stopping("interrupted");
  CHECK_FALSE(f.recovery->under_way());
  CHECK(f.host.take_told() == "-1: event=fallback reason=group_stopped\n");
  CHECK(f.host.stopped.empty());
  f.recovery->group_stopping("again");  // nothing under way: nothing said
  CHECK(f.host.told.empty());
  f.clock.advance(1h);
  CHECK(f.host.stopped.empty());
}

TEST_CASE("rank recovery on several nodes: losing the agents' store stops the group") {
  Fixture f(2, 2, [](ag::Options&, ag::RecoveryPlace& p) {
    p.round.group_world_size = 2;
    p.round.node_id = "a";
    p.round.open_agents_store = [](auto, auto) -> std::unique_ptr<ddprun::rendezvous::Store> {
      throw ddprun::rendezvous::StoreError("connection refused");
    };
  });
  auto guard = boost::asio::make_work_guard(f.io);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (f.host.stopped.empty() && std::chrono::steady_clock::now() < deadline)
    f.io.run_one_for(20ms);
  REQUIRE(f.host.stopped.size() == 1);
  CHECK(f.host.stopped[0].reason.find("lost the agents' store") != std::string::npos);
  CHECK(f.host.take_told() == "-1: event=fallback reason=store_lost\n");
  f.recovery->stop();
}
