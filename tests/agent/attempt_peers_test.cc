// Attempt with --restart-scope=rank on several nodes (rank_recovery_peers.cc,
// peer_recovery.h): the attempt is node "a" of a 2-node round on a real
// store (a server on loopback); the test is node "b", reading and writing
// the job protocol's records (rendezvous/job_protocol.h) as b's agent
// would, and speaks for a's workers on their channel ends. Waits are on
// the attempt's loop, bounded; multinode.train_rank runs it for real.
#include <doctest/doctest.h>
#include <sys/socket.h>

#include <boost/asio/executor_work_guard.hpp>
#include <chrono>
#include <string>

#include "rendezvous/client.h"
#include "rendezvous/job_protocol.h"
#include "tests/agent/attempt_harness.h"
#include "tests/rendezvous/test_util.h"

namespace ag = ddprun::agent;
namespace rdzv = ddprun::rendezvous;
using namespace std::chrono_literals;
using namespace ag::test;

namespace {

constexpr int64_t kRound = 3;

struct TwoNodes {
  rdzv::testing::ServerThread server;
  rdzv::Client b{server.client_options()};  // node b's agent
  rdzv::JobKeys keys{"unit"};
  Harness h{2, 5.0,
            [](ag::Options& o) {
              o.restart_scope = ag::RestartScope::kRank;
              o.max_restarts = 3;
              o.recovery_timeout = std::chrono::seconds(10);
            },
            [this](ag::AttemptSetup& s) {
              s.round.group_world_size = 2;
              s.round.world_size = 4;
              s.round.rank_base = 0;
              s.round.round = kRound;
              s.round.node_id = "a";
              s.round.open_agents_store = [options = server.client_options()](
                                              rdzv::Duration, std::shared_ptr<rdzv::Canceller> c) {
                auto o = options;
                o.canceller = std::move(c);
                return std::make_unique<rdzv::Client>(o);
              };
            }};
  std::string got[4];  // packets each worker (spawn index) received so far

  // Runs a's loop until `done`, or 10 s pass.
  bool run_until(const std::function<bool()>& done) {
    auto guard = boost::asio::make_work_guard(h.io);
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!done()) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      h.io.run_one_for(20ms);
    }
    return true;
  }
  // ... until worker `w` has received a packet containing `text`.
  bool wait_packet(int w, const std::string& text) {
    return run_until([&] {
      drain(w);
      return got[w].find(text) != std::string::npos;
    });
  }
  bool fell_back(const std::string& reason) {
    return run_until([&] {
      return !h.hooks.recoveries.empty() &&
             h.hooks.recoveries.back().kind == ag::RecoveryEvent::Kind::kFallback &&
             h.hooks.recoveries.back().reason == reason;
    });
  }
  void drain(int w) {
    const int fd = h.launcher.channel(w);
    char buf[600];
    for (ssize_t n; fd >= 0 && (n = recv(fd, buf, sizeof buf, MSG_DONTWAIT)) > 0;)
      got[w] += std::string(buf, size_t(n)) + "\n";
  }
  void joined(int w, int generation, int rank) {
    const std::string p = "event=joined generation=" + std::to_string(generation) +
                          " rank=" + std::to_string(rank);
    REQUIRE(send(h.launcher.channel(w), p.data(), p.size(), 0) == ssize_t(p.size()));
    h.io.poll();
  }
  rdzv::RankFailure b_failed(int rank) const {
    rdzv::RankFailure f;
    f.generation = 1;
    f.ranks = {rank};
    f.node = "b";
    return f;
  }
};

}  // namespace

TEST_CASE("several nodes: a failure here opens the generation in the store; recovered once node b joined") {
  TwoNodes t;
  t.h.start();
  t.h.launcher.exit(1, exited_with(3));
  t.h.reap();
  REQUIRE(t.h.launcher.requests.size() == 3);  // the replacement, here
  const rdzv::RankFailure f = rdzv::await_rank_failure(t.b, t.keys, kRound, 1, 10s);
  CHECK(f.ranks == std::vector<int>{1});
  CHECK(f.node == "a");
  CHECK(f.cause == rdzv::RankFailure::kExit);
  t.joined(0, 1, 0);
  t.joined(2, 1, 1);
  // Every rank here joined: a says so (off its loop), and waits for b.
  CHECK(t.run_until([&] { return t.b.add(t.keys.generation_joined(kRound, 1), 0) == 1; }));
  t.drain(0);
  CHECK(t.got[0].find("event=recovered") == std::string::npos);
  rdzv::publish_generation_joined(t.b, t.keys, kRound, 1, 2);
  CHECK(t.wait_packet(0, "event=recovered generation=1 ranks=1"));
  CHECK(t.wait_packet(2, "event=recovered generation=1 ranks=1"));
  CHECK(t.h.hooks.recoveries.back().kind == ag::RecoveryEvent::Kind::kJoined);
  CHECK_FALSE(t.h.hooks.failed);
}

TEST_CASE("several nodes: node b's record makes the ranks here re-form; nothing is replaced here") {
  TwoNodes t;
  t.h.start();
  REQUIRE(rdzv::publish_rank_failure(t.b, t.keys, kRound, t.b_failed(3)));
  for (int w : {0, 1}) CHECK(t.wait_packet(w, "event=failed generation=1 ranks=3 cause=exit"));
  CHECK(t.h.launcher.requests.size() == 2);
  CHECK(t.h.launcher.signals_to(0).empty());
  CHECK(t.h.launcher.signals_to(1).empty());
  REQUIRE_FALSE(t.h.hooks.recoveries.empty());
  CHECK(t.h.hooks.recoveries[0].kind == ag::RecoveryEvent::Kind::kFailed);
  CHECK(t.h.hooks.recoveries[0].ranks == std::vector<int>{3});
  rdzv::publish_generation_joined(t.b, t.keys, kRound, 1, 2);  // b first, this time
  t.joined(0, 1, 0);
  t.joined(1, 1, 1);
  CHECK(t.wait_packet(1, "event=recovered generation=1 ranks=3"));
  CHECK_FALSE(t.h.hooks.failed);
}

TEST_CASE("several nodes: a failure here during node b's recovery falls back to the group path") {
  TwoNodes t;
  t.h.start();
  REQUIRE(rdzv::publish_rank_failure(t.b, t.keys, kRound, t.b_failed(3)));
  REQUIRE(t.wait_packet(0, "event=failed generation=1"));
  t.h.launcher.exit(1, exited_with(4));
  t.h.reap();
  CHECK(t.wait_packet(0, "event=fallback reason=second_failure"));
  REQUIRE(t.h.hooks.failed);
  CHECK(t.h.hooks.failed->exit_code == 4);
  CHECK(t.h.launcher.requests.size() == 2);  // no replacement
}

TEST_CASE("several nodes: two nodes failing at once for the same generation is a second failure") {
  TwoNodes t;
  t.h.start();
  // b's record is in before a's failure; whichever a hears of first (its
  // watch, or its own write losing), the group path follows.
  REQUIRE(rdzv::publish_rank_failure(t.b, t.keys, kRound, t.b_failed(3)));
  t.h.launcher.exit(1, exited_with(3));
  t.h.reap();
  // (The fake workers end on the teardown's SIGTERM: the hooks say it.)
  CHECK(t.fell_back("second_failure"));
  REQUIRE(t.h.hooks.failed);
  CHECK(rdzv::read_rank_failure(t.b, t.keys, kRound, 1)->node == "b");
}
