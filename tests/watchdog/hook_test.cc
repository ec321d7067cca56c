// WatchdogHook on a ManualClock, with the other nodes behind an in-memory
// PeerChannel and the attempt behind a fake AttemptControl: the cross-node
// hold of --restart-scope=rank (peer_stall.h: kAskPeers, then
// kAwaitPeerGeneration when another node names a rank of its own), and what
// a hang asks of the attempt. Beats are real datagrams on the hook's socket;
// time moves only when a test moves it.
#include <doctest/doctest.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/contract.h"
#include "base/scoped_fd.h"
#include "tests/common/temp_dir.h"
#include "watchdog/agent_hook.h"
#include "watchdog/peer_stall.h"

namespace ag = ddprun::agent;
namespace wd = ddprun::watchdog;
using namespace std::chrono_literals;
using ddprun::base::ManualClock;

namespace {

// Beyond any pid the kernel hands out (PID_MAX_LIMIT is 2^22): /proc has
// nothing for them, so no stack tool or signal can reach a real process.
constexpr pid_t kPidBase = 1 << 30;
constexpr auto kTimeout = 2s;  // the fixed heartbeat timeout

class FakeControl : public ag::AttemptControl {
 public:
  explicit FakeControl(boost::asio::io_context& io) : io_(io) {}
  void fail_attempt(const ag::FailRequest& request) override { fails.push_back(request); }
  void continue_running_workers() override { ++continues; }
  boost::asio::io_context& io() override { return io_; }

  std::vector<ag::FailRequest> fails;
  int continues = 0;

 private:
  boost::asio::io_context& io_;
};

// The other nodes, as this node's channel sees them.
struct FakePeers {
  std::vector<wd::NodeRecord> published;
  wd::PeerChannel::Changed deliver;  // set when the hook opens the channel

  wd::OpenPeerChannel opener() {
    return [this](wd::GuardPlace, wd::PeerChannel::Changed changed) -> std::unique_ptr<wd::PeerChannel> {
      deliver = std::move(changed);
      return std::make_unique<Channel>(*this);
    };
  }

 private:
  struct Channel : wd::PeerChannel {
    explicit Channel(FakePeers& peers) : peers(peers) {}
    void publish(wd::NodeRecord record) override { peers.published.push_back(std::move(record)); }
    FakePeers& peers;
  };
};

wd::HookOptions rank_scope_options() {
  wd::HookOptions o;
  o.learn = false;
  o.detect.heartbeat_timeout = kTimeout;
  o.detect.stuck_timeout = 0ms;  // no /proc polling of the made-up pids
  o.on_hang = wd::OnHang::kRestart;
  o.rank_scope = true;
  o.max_native_captures = 0;  // no stack tools: the verdict follows at once
  o.live_stacks = false;
  return o;
}

// One node (group rank 0 of 2) with local ranks 0 and 1 (global 0 and 1).
struct Node {
  explicit Node(wd::HookOptions options = rank_scope_options())
      : hook(io, std::move(options), wd::HookSeams{&clock, peers.opener(), nullptr}), control(io) {
    std::filesystem::create_directories(dir.file("run/attempt_0"));
    attempt.log_dir = dir.file("run/attempt_0");
    attempt.runtime_dir = dir.path();
    attempt.round.group_rank = 0;
    attempt.round.group_world_size = 2;
    attempt.round.world_size = 4;
    attempt.round.local_world_size = 2;
    attempt.round.store_addr = "127.0.0.1:1";  // never dialled: the channel is FakePeers
    ag::AttemptInfo spawning = attempt;
    for (int local = 0; local < 2; ++local) {
      ag::EnvMap env;
      hook.add_worker_env(spawning, local, env);
      socket_path = env.at(ddprun::base::kEnvHeartbeatSocket);
      ag::WorkerInfo w;
      w.local_rank = local;
      w.rank = local;
      w.pid = kPidBase + local;
      attempt.workers.push_back(w);
    }
    hook.workers_started(attempt, control);
  }

  // Sends "hb <rank> <step>" to the hook's socket and runs the loop until
  // the watchdog counted it.
  void beat(int rank, int64_t step) {
    const ddprun::base::ScopedFd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    REQUIRE(fd.get() >= 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket_path.c_str(), sizeof(addr.sun_path) - 1);
    const std::string datagram = "hb " + std::to_string(rank) + " " + std::to_string(step) + "\n";
    REQUIRE(::sendto(fd.get(), datagram.data(), datagram.size(), 0,
                     reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) ==
            static_cast<ssize_t>(datagram.size()));
    const uint64_t before = beats(rank);
    // The datagram is queued already: the deadline only bounds a broken test.
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (beats(rank) == before && std::chrono::steady_clock::now() < deadline)
      io.run_one_until(deadline);
    REQUIRE(beats(rank) == before + 1);
  }

  uint64_t beats(int rank) const {
    for (const auto& w : hook.watchdog()->workers())
      if (w.global_rank == rank) return w.beats;
    return 0;
  }

  // Another node's record arrives (PeerGuards posts it to the loop).
  void hear(int node, wd::NodeRecord record) {
    wd::NodeGuards g;
    g.node = node;
    g.seq = ++seq;
    g.record = std::move(record);
    peers.deliver({g});
    io.restart();
    io.poll();
  }

  const wd::NodeRecord& last_published() const {
    REQUIRE(!peers.published.empty());
    return peers.published.back();
  }

  ddprun::testing::TempDir dir;
  ManualClock clock;
  boost::asio::io_context io;
  FakePeers peers;
  wd::WatchdogHook hook;
  FakeControl control;
  ag::AttemptInfo attempt;
  std::string socket_path;
  uint64_t seq = 0;
};

wd::NodeRecord stall_record(int rank, int64_t step, std::chrono::milliseconds silent) {
  wd::NodeRecord r;
  r.stall = wd::PeerStall{rank, step, silent};
  return r;
}

// Both ranks beat, rank 1 a step behind, then stay silent past the
// timeout: the node holds the hang of its culprit, rank 1.
void stall_with_rank_1_behind(Node& node) {
  node.beat(0, 5);
  node.beat(1, 4);
  node.clock.advance(kTimeout);
}

}  // namespace

TEST_CASE("a rank-scope hang is held while the other nodes are asked, and acted on after kAskPeers") {
  Node node;
  stall_with_rank_1_behind(node);

  REQUIRE(node.last_published().stall.has_value());
  CHECK(node.last_published().stall->rank == 1);
  CHECK(node.last_published().stall->step == 4);
  CHECK(node.control.fails.empty());

  node.clock.advance(wd::kAskPeers - 1ms);
  CHECK(node.control.fails.empty());

  node.clock.advance(1ms);
  REQUIRE(node.control.fails.size() == 1);
  CHECK(node.control.fails[0].replace_local_rank == 1);
  CHECK(node.control.fails[0].exit_code == wd::kExitHang);
  // The other nodes hear whom this node acts on, and that it holds no stall.
  CHECK_FALSE(node.last_published().stall.has_value());
  CHECK(node.last_published().blamed == std::vector<int>{1});
}

TEST_CASE("a held hang is acted on at once when another node's ranks stalled further on") {
  Node node;
  stall_with_rank_1_behind(node);
  REQUIRE(node.control.fails.empty());

  node.hear(1, stall_record(2, 9, 2000ms));
  REQUIRE(node.control.fails.size() == 1);
  CHECK(node.control.fails[0].replace_local_rank == 1);
}

TEST_CASE("a node that names a rank of its own is waited for up to kAwaitPeerGeneration, then acted on") {
  Node node;
  stall_with_rank_1_behind(node);
  // Node 1's rank 3 is behind ours (step 2): node 1 acts on it and says so.
  node.hear(1, stall_record(3, 2, 3000ms));
  CHECK(node.control.fails.empty());
  wd::NodeRecord blamed;
  blamed.blamed = {3};
  node.hear(1, blamed);

  node.clock.advance(wd::kAskPeers);
  CHECK(node.control.fails.empty());
  node.clock.advance(wd::kAwaitPeerGeneration - wd::kAskPeers - 1ms);
  CHECK(node.control.fails.empty());
  node.clock.advance(1ms);
  REQUIRE(node.control.fails.size() == 1);
  CHECK(node.control.fails[0].replace_local_rank == 1);
}

TEST_CASE("a held hang is dropped when another node's rank fails, and the watchdog watches on") {
  Node node;
  stall_with_rank_1_behind(node);
  wd::NodeRecord blamed;
  blamed.blamed = {3};
  node.hear(1, blamed);

  ag::RecoveryEvent failed;
  failed.kind = ag::RecoveryEvent::Kind::kFailed;
  failed.ranks = {3};
  failed.cause = "hang";
  node.hook.recovery(failed);
  CHECK_FALSE(node.last_published().stall.has_value());
  CHECK_FALSE(node.hook.watchdog()->fired());

  // Nothing of the held hang is left to fire: no verdict in the next minute
  // while the ranks beat (the survivors re-form with node 1's replacement).
  for (int i = 0; i < 60; ++i) {
    node.beat(0, 5);
    node.beat(1, 5);
    node.clock.advance(1s);
  }
  CHECK(node.control.fails.empty());
}

TEST_CASE("another node's stall blames a rank of this node that is behind it, at once") {
  Node node;
  node.beat(0, 5);
  node.beat(1, 4);
  node.clock.advance(1s);  // within the timeout: no hang of its own yet
  // Node 1's rank 2 waits at step 9, silent 1.5 s there; rank 1 here is at
  // step 4 and silent 1 s (at least half as long): it stopped first.
  node.hear(1, stall_record(2, 9, 1500ms));
  REQUIRE(node.control.fails.size() == 1);
  CHECK(node.control.fails[0].replace_local_rank == 1);
  CHECK(node.last_published().blamed == std::vector<int>{1});
}

TEST_CASE("a hang's teardown continues the workers through the attempt, after the failure") {
  wd::HookOptions o = rank_scope_options();
  o.rank_scope = false;
  o.on_hang = wd::OnHang::kExit;
  Node node(o);
  node.beat(0, 1);
  node.beat(1, 1);
  node.clock.advance(kTimeout);
  REQUIRE(node.control.fails.size() == 1);
  CHECK_FALSE(node.control.fails[0].replace_local_rank.has_value());
  // Only the attempt signals its workers: it knows which are not reaped.
  CHECK(node.control.continues == 1);
}

namespace {

// Counts the hang reports renamed into place in `dir` (SafeDir writes each
// one atomically: one IN_MOVED_TO per write).
class ReportWrites {
 public:
  explicit ReportWrites(const std::string& dir)
      : fd_(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {
    if (fd_.get() < 0 || ::inotify_add_watch(fd_.get(), dir.c_str(), IN_MOVED_TO) < 0)
      throw std::runtime_error("inotify on " + dir + " failed");
  }
  int count() {
    alignas(inotify_event) char buf[4096];
    for (;;) {
      const ssize_t n = ::read(fd_.get(), buf, sizeof(buf));
      if (n <= 0) return count_;
      for (ssize_t at = 0; at < n;) {
        const auto* e = reinterpret_cast<const inotify_event*>(buf + at);
        if (e->len > 0 && std::string(e->name) == ddprun::base::kFileHangReportJson) ++count_;
        at += static_cast<ssize_t>(sizeof(inotify_event) + e->len);
      }
    }
  }

 private:
  ddprun::base::ScopedFd fd_;
  int count_ = 0;
};

}  // namespace

TEST_CASE("--on-hang=report writes the hang report once and keeps the attempt running") {
  wd::HookOptions o = rank_scope_options();
  o.rank_scope = false;
  o.on_hang = wd::OnHang::kReport;
  auto files = wd::make_watchdog_writer();
  ddprun::testing::TempDir dir;
  const std::string attempt_dir = dir.file("run/attempt_0");
  std::filesystem::create_directories(attempt_dir);
  ReportWrites writes(attempt_dir);

  ManualClock clock;
  boost::asio::io_context io;
  wd::WatchdogHook hook(io, o, wd::HookSeams{&clock, {}, files});
  FakeControl control(io);
  ag::AttemptInfo attempt;
  attempt.log_dir = attempt_dir;
  attempt.runtime_dir = dir.path();
  ag::WorkerInfo w;
  w.pid = kPidBase;
  ag::EnvMap env;
  hook.add_worker_env(attempt, 0, env);
  attempt.workers.push_back(w);
  hook.workers_started(attempt, control);

  clock.advance(wd::WatchdogOptions::kDefaultGrace);  // no first beat within the grace
  CHECK(control.fails.empty());
  CHECK(hook.last_report_dir() == attempt_dir);

  ag::AttemptResult result;
  result.outcome = ag::Outcome::kSucceeded;
  hook.attempt_ended(result);
  REQUIRE(files->flush(std::chrono::steady_clock::now() + 10s));
  CHECK(writes.count() == 1);
}
