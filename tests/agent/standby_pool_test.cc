// StandbyPool (standby_pool.h) alone: a fake StandbySpawner hands out
// "standbys" with real recovery channels (the test holds the worker's end
// and reads what the pool tells it) and a fake launcher logs the signals.
// No process is started; the pool never waits, so neither does the test.
#include <doctest/doctest.h>
#include <errno.h>
#include <signal.h>
#include <sys/socket.h>

#include <boost/asio/io_context.hpp>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "agent/standby_pool.h"
#include "base/scoped_fd.h"

namespace ag = ddprun::agent;

namespace {

inline int killed_by(int sig) { return sig & 0x7f; }

// Standby number n is pid 500 + n.
pid_t pid_of(int number) { return 500 + number; }

struct FakeStandbySpawner : ag::StandbySpawner {
  explicit FakeStandbySpawner(boost::asio::io_context& io) : io(io) {}

  boost::asio::io_context& io;
  std::set<int> fail_spawn;  // numbers whose fork fails
  std::set<int> fail_exec;   // numbers whose exec fails
  std::vector<int> spawned;  // numbers, in order
  std::map<int, ddprun::base::ScopedFd> ends;  // each standby's end of its channel

  ag::WorkerProcess spawn_standby(int number) override {
    if (fail_spawn.count(number))
      throw ag::SpawnError("fork: Resource temporarily unavailable", EAGAIN);
    spawned.push_back(number);
    ag::WorkerProcess w;
    w.info.pid = pid_of(number);
    w.info.rank = w.info.local_rank = -1;
    w.alive = true;
    w.standby = number;
    w.slot = std::make_shared<int>(-1);
    auto pair = ag::RecoveryChannel::open(io);
    w.channel = std::move(pair.agent);
    ends[number] = std::move(pair.worker);
    return w;
  }
  std::optional<ag::SpawnError> finish_exec(ag::WorkerProcess& w) override {
    if (!fail_exec.count(w.standby)) return std::nullopt;
    w.alive = false;  // as Attempt::finish_exec: it never ran
    return ag::SpawnError("cannot execute 'x': Text file busy", ETXTBSY, true);
  }
  // What standby `number` was told, one packet a line.
  std::string received(int number) {
    std::string out;
    char buf[600];
    for (ssize_t n; (n = recv(ends.at(number).get(), buf, sizeof buf, MSG_DONTWAIT)) > 0;)
      out += std::string(buf, size_t(n)) + "\n";
    return out;
  }
};

// Logs group signals as (standby number, signal).
struct SignalLog : ag::ProcessLauncher {
  std::vector<std::pair<int, int>> groups;
  pid_t spawn(ag::SpawnRequest) override { throw ag::SpawnError("not in this test", 0); }
  void signal(pid_t, int) override {}
  void signal_group(pid_t pgid, int sig) override { groups.emplace_back(pgid - 500, sig); }
  void kill_job() override {}
  void sweep_leftovers() override {}
  void release(pid_t) override {}
  bool idle(pid_t) override { return false; }
};

struct Fixture {
  explicit Fixture(int standbys, int restarts = 2) {
    options.restart_scope = ag::RestartScope::kRank;
    options.standby_workers = standbys;
    options.max_restarts = restarts;
    options.log_line_prefix_template = "[${role_name}${rank}]:";
    options.role = "trainer";
  }
  std::vector<int> pool() const {
    std::vector<int> out;
    for (const auto& s : standbys.workers()) out.push_back(s.alive ? s.standby : -s.standby);
    return out;
  }

  boost::asio::io_context io;
  ag::Options options;
  SignalLog launcher;
  FakeStandbySpawner spawner{io};
  ag::StandbyPool standbys{options, launcher, spawner};
};

}  // namespace

TEST_CASE("standby pool: refill starts --standby-workers standbys, numbered from 1, once") {
  Fixture f(2);
  f.standbys.refill(2, 0);
  CHECK(f.spawner.spawned == std::vector<int>{1, 2});
  CHECK(f.pool() == std::vector<int>{1, 2});
  f.standbys.refill(2, 0);  // both alive: nothing more
  CHECK(f.spawner.spawned.size() == 2);
}

TEST_CASE("standby pool: no standby where no restart is left") {
  Fixture f(2, 0);
  f.standbys.refill(0, 0);
  CHECK(f.spawner.spawned.empty());
  CHECK(f.standbys.workers().empty());
}

TEST_CASE("standby pool: assign tells a standby its slot, hands it over, and refill replaces it") {
  Fixture f(2);
  f.standbys.refill(2, 0);
  auto s = f.standbys.assign(1, 5, 3);
  REQUIRE(s);
  CHECK(s->standby == 1);
  CHECK(s->info.rank == 5);
  CHECK(s->info.local_rank == 1);
  CHECK(*s->slot == 1);
  CHECK(s->prefix == "[trainer5]:");
  CHECK(f.spawner.received(1) == "event=assign generation=3 rank=5 local_rank=1\n");
  CHECK(f.spawner.received(2).empty());
  CHECK(f.pool() == std::vector<int>{2});
  CHECK(f.launcher.groups.empty());
  // The recovery is over: the next standby is number 3.
  f.standbys.refill(1, 3);
  CHECK(f.pool() == std::vector<int>{2, 3});
}

TEST_CASE("standby pool: assign with no standby, or one that cannot be told, gives nothing") {
  Fixture f(1);
  CHECK_FALSE(f.standbys.assign(0, 0, 1));
  f.standbys.refill(2, 0);
  f.spawner.ends.at(1).reset();  // its end is gone: it is dying
  CHECK_FALSE(f.standbys.assign(0, 0, 1));
  CHECK(f.launcher.groups == std::vector<std::pair<int, int>>{{1, SIGKILL}});
  // Still the pool's until its exit comes: then a standby's loss.
  CHECK(f.pool() == std::vector<int>{1});
  CHECK(f.standbys.on_exit(pid_of(1), killed_by(SIGKILL), true, 2, true));
  CHECK(f.pool() == std::vector<int>{-1});
}

TEST_CASE("standby pool: a standby that cannot be told is skipped for the next one, and not tried again") {
  Fixture f(2);
  f.standbys.refill(2, 0);
  f.spawner.ends.at(1).reset();
  auto s = f.standbys.assign(0, 4, 1);
  REQUIRE(s);
  CHECK(s->standby == 2);
  CHECK(f.spawner.received(2) == "event=assign generation=1 rank=4 local_rank=0\n");
  CHECK(f.launcher.groups == std::vector<std::pair<int, int>>{{1, SIGKILL}});
  // Its exit is not reaped yet: a second failure must not pick it again.
  CHECK_FALSE(f.standbys.assign(1, 5, 2));
  CHECK(f.launcher.groups.size() == 1);
}

TEST_CASE("standby pool: a standby that dies is replaced, except during a recovery; a stranger's exit is not its") {
  Fixture f(1);
  f.standbys.refill(2, 0);
  CHECK_FALSE(f.standbys.on_exit(pid_of(9), 0, true, 2, false));
  CHECK(f.standbys.on_exit(pid_of(1), killed_by(SIGSEGV), true, 2, false));
  CHECK(f.launcher.groups == std::vector<std::pair<int, int>>{{1, SIGKILL}});
  CHECK(f.spawner.spawned == std::vector<int>{1, 2});
  CHECK_FALSE(f.standbys.workers()[0].channel->is_open());
  CHECK_FALSE(f.standbys.on_exit(pid_of(1), 0, true, 2, false));  // reaped once
  CHECK(f.standbys.on_exit(pid_of(2), killed_by(SIGSEGV), true, 2, true));
  CHECK(f.spawner.spawned.size() == 2);  // recovering: refill is the recovery's end's
  f.standbys.refill(2, 1);
  CHECK(f.spawner.spawned == std::vector<int>{1, 2, 3});
}

TEST_CASE("standby pool: after --max-restarts + --standby-workers losses no standby starts again") {
  Fixture f(1, 1);  // a budget of 2 losses
  f.standbys.refill(1, 0);
  CHECK(f.standbys.on_exit(pid_of(1), killed_by(SIGSEGV), true, 1, false));
  CHECK(f.spawner.spawned == std::vector<int>{1, 2});
  CHECK(f.standbys.on_exit(pid_of(2), killed_by(SIGSEGV), true, 1, false));
  CHECK(f.spawner.spawned.size() == 2);
  f.standbys.refill(1, 1);
  CHECK(f.spawner.spawned.size() == 2);
}

TEST_CASE("standby pool: a standby that cannot start stops the refill; the next refill tries again") {
  Fixture f(2);
  f.spawner.fail_exec = {1};
  f.standbys.refill(2, 0);
  CHECK(f.pool() == std::vector<int>{-1});
  f.spawner.fail_spawn = {2};
  f.standbys.refill(2, 0);
  CHECK(f.pool() == std::vector<int>{-1});
  f.standbys.refill(2, 0);
  CHECK(f.pool() == std::vector<int>{-1, 3, 4});
}

TEST_CASE("standby pool: end SIGKILLs the standbys left, once; their exits are quiet") {
  Fixture f(2);
  CHECK_FALSE(f.standbys.end());  // none
  f.standbys.refill(2, 0);
  CHECK(f.standbys.end());
  CHECK(f.launcher.groups == std::vector<std::pair<int, int>>{{1, SIGKILL}, {2, SIGKILL}});
  CHECK(f.standbys.end());  // still waiting for them; not signalled again
  CHECK(f.launcher.groups.size() == 2);
  // Their exits start nothing, even while the group is said to run.
  CHECK(f.standbys.on_exit(pid_of(1), killed_by(SIGKILL), true, 2, false));
  CHECK(f.spawner.spawned.size() == 2);
  CHECK(f.standbys.end());
  CHECK(f.standbys.on_exit(pid_of(2), killed_by(SIGKILL), true, 2, false));
  CHECK_FALSE(f.standbys.end());
}

TEST_CASE("standby pool: forget stops waiting for standbys that SIGKILL did not end") {
  Fixture f(1);
  f.standbys.refill(2, 0);
  REQUIRE(f.standbys.end());
  f.standbys.forget();
  CHECK_FALSE(f.standbys.end());
  CHECK_FALSE(f.standbys.on_exit(pid_of(1), killed_by(SIGKILL), true, 2, false));
}
