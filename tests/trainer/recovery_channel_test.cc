// train's end of the recovery channel (trainer/recovery_channel.h) over a
// real SOCK_SEQPACKET socket pair, the test holding the agent's end.
#include <doctest/doctest.h>
#include <sys/socket.h>

#include <chrono>
#include <string>

#include "base/scoped_fd.h"
#include "trainer/recovery_channel.h"

using namespace ddprun::trainer;
using namespace std::chrono_literals;
using ddprun::base::ScopedFd;

namespace {

struct Pair {
  ScopedFd agent;
  int worker = -1;  // owned by the RecoveryChannel under test
};

Pair seqpacket_pair() {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
  return Pair{ScopedFd(sv[0]), sv[1]};
}

void send(const ScopedFd& fd, const std::string& packet) {
  REQUIRE(::send(fd.get(), packet.data(), packet.size(), MSG_NOSIGNAL) == ssize_t(packet.size()));
}

std::string receive(const ScopedFd& fd) {
  char buf[600];
  const ssize_t n = ::recv(fd.get(), buf, sizeof buf, MSG_DONTWAIT);
  return n > 0 ? std::string(buf, size_t(n)) : std::string();
}

std::string message_of(const char* scope, const char* fd, const char* generation) {
  try {
    parse_recovery_env(scope, fd, generation);
  } catch (const TrainerError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("recovery channel: the environment, and one line naming what is wrong") {
  CHECK_FALSE(parse_recovery_env(nullptr, nullptr, nullptr).rank_scope);
  CHECK_FALSE(parse_recovery_env("group", "junk", "junk").rank_scope);  // ignored in group scope
  Pair p = seqpacket_pair();
  ScopedFd worker(p.worker);
  const std::string fd = std::to_string(worker.get());
  const RecoveryEnv env = parse_recovery_env("rank", fd.c_str(), "3");
  CHECK(env.rank_scope);
  CHECK(env.fd == worker.get());
  CHECK(env.generation == 3);
  CHECK(parse_recovery_env("rank", fd.c_str(), nullptr).generation == 0);

  CHECK(message_of("node", nullptr, nullptr).find("DDPRUN_RESTART_SCOPE=node: not rank or group") == 0);
  CHECK(message_of("rank", nullptr, "0").find("DDPRUN_RECOVERY_FD=: unset") == 0);
  CHECK(message_of("rank", "x3", "0").find("DDPRUN_RECOVERY_FD=x3: not a descriptor number") == 0);
  CHECK(message_of("rank", "999999", "0").find("not an open descriptor") != std::string::npos);
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  ScopedFd r(pipe_fds[0]), w(pipe_fds[1]);
  CHECK(message_of("rank", std::to_string(r.get()).c_str(), "0")
            .find("not a SOCK_SEQPACKET socket") != std::string::npos);
  CHECK(message_of("rank", fd.c_str(), "-1").find("DDPRUN_GENERATION=-1: not a generation") == 0);
  CHECK(message_of("rank", fd.c_str(), "1x").find("DDPRUN_GENERATION=1x") == 0);
  for (const std::string& m : {message_of("node", nullptr, nullptr), message_of("rank", "x", "0")})
    CHECK(m.find('\n') == std::string::npos);
}

TEST_CASE("recovery channel: only a failure of this generation asks collectives to abort") {
  Pair p = seqpacket_pair();
  RecoveryChannel ch(p.worker, 0);
  CHECK_FALSE(ch.requested());
  send(p.agent, "event=ready generation=1 ranks=1");           // informational
  send(p.agent, "event=failed generation=0 ranks=1 cause=exit");  // stale
  send(p.agent, "garbage without equals");                       // logged, ignored
  send(p.agent, "event=failed generation=x");                    // malformed number
  send(p.agent, "event=resize generation=4");                    // an event added later
  CHECK_FALSE(ch.requested());
  send(p.agent, "event=failed generation=1 ranks=1,3 cause=hang future=ignored");
  CHECK(ch.requested());
  CHECK(ch.failed_ranks() == std::vector<int>{1, 3});
  CHECK(ch.wait_failed(std::chrono::steady_clock::now() + 5s, "test deadline") == 1);
  CHECK(ch.generation() == 1);
  CHECK_FALSE(ch.requested());  // forming generation 1: its collectives must not abort
  ch.joined(2);
  CHECK(receive(p.agent) == "event=joined generation=1 rank=2");
  send(p.agent, "event=failed generation=2 ranks=0 cause=exit");
  CHECK(ch.requested());
}

TEST_CASE("recovery channel: waits end on their deadline, on fallback and on the agent's exit") {
  {
    Pair p = seqpacket_pair();
    RecoveryChannel ch(p.worker, 0);
    const auto start = std::chrono::steady_clock::now();
    try {
      ch.wait_failed(start + 200ms, "--recovery-timeout 0.2 s");
      FAIL("no throw");
    } catch (const TrainerError& e) {
      CHECK(std::string(e.what()) ==
            "no event=failed for generation 1 within --recovery-timeout 0.2 s");
    }
    CHECK(std::chrono::steady_clock::now() - start >= 200ms);
  }
  {
    Pair p = seqpacket_pair();
    RecoveryChannel ch(p.worker, 0);
    send(p.agent, "event=fallback reason=second_failure");
    CHECK(ch.requested());
    CHECK_THROWS_WITH(ch.wait_failed(std::chrono::steady_clock::now() + 5s, "x"),
                      doctest::Contains("event=fallback reason=second_failure"));
  }
  {
    Pair p = seqpacket_pair();
    RecoveryChannel ch(p.worker, 0);
    p.agent.reset();
    CHECK_FALSE(ch.requested());
    CHECK(ch.fd() == -1);  // nothing more can come: poll() skips it
    CHECK_THROWS_WITH(ch.wait_failed(std::chrono::steady_clock::now() + 5s, "x"),
                      doctest::Contains("closed by the agent"));
    ch.joined(0);  // no agent: nothing to send, no SIGPIPE
  }
}

TEST_CASE("recovery channel: a standby waits for event=assign, then is the assigned rank") {
  Pair p = seqpacket_pair();
  const std::string fd = std::to_string(p.worker);
  CHECK(parse_recovery_env("rank", fd.c_str(), "0", "2").standby == 2);
  CHECK(parse_recovery_env("rank", fd.c_str(), "0", nullptr).standby == 0);
  for (const char* bad : {"0", "x"}) {
    try {
      parse_recovery_env("rank", fd.c_str(), "0", bad);
      FAIL("DDPRUN_STANDBY=" << bad << " accepted");
    } catch (const TrainerError& e) {
      CHECK(std::string(e.what()).find(std::string("DDPRUN_STANDBY=") + bad) == 0);
    }
  }
  CHECK_THROWS_AS(parse_recovery_env("group", nullptr, nullptr, "1"), TrainerError);
  RecoveryChannel channel(p.worker, 0, 1);
  CHECK(channel.standby() == 1);
  // What is not an assignment is no reason to stop waiting; SIGTERM's flag is.
  send(p.agent, "event=failed generation=1 ranks=0 cause=exit");
  send(p.agent, "event=assign generation=1 rank=1");  // no local_rank: ignored
  volatile std::sig_atomic_t stop = 1;
  CHECK_FALSE(channel.wait_assigned(&stop).has_value());
  stop = 0;
  send(p.agent, "event=assign generation=2 rank=3 local_rank=1");
  const std::optional<Assignment> a = channel.wait_assigned(&stop);
  REQUIRE(a.has_value());
  CHECK(a->rank == 3);
  CHECK(a->local_rank == 1);
  CHECK(a->generation == 2);
  CHECK(channel.generation() == 2);
  CHECK(channel.standby() == 0);
  // The failure of generation 1 happened before it joined: no abort.
  CHECK_FALSE(channel.requested());
  channel.joined(3);
  CHECK(receive(p.agent) == "event=joined generation=2 rank=3");
}

TEST_CASE("recovery channel: a standby's wait ends when the agent closes the channel") {
  Pair p = seqpacket_pair();
  RecoveryChannel channel(p.worker, 0, 1);
  p.agent.reset();
  CHECK_THROWS_AS(channel.wait_assigned(nullptr), TrainerError);
}
