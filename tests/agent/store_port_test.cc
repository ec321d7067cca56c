// The rendezvous store's port taken by something that is no store: the
// agent that was to host it (its machine owns the endpoint's HOST) joins
// whatever holds the port, as it would another agent of the job; once the
// port is free it hosts the store itself and the job runs. Before, it
// waited out the whole join_timeout (600 s) for a store nobody would ever
// serve: introspect.nodes lost a loaded run that way, its free port taken
// by another test's connection between the test's check and ddprun's bind.
#include <doctest/doctest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "tests/common/loopback_port.h"
#include "tests/agent/ddprun_process.h"

namespace {

using ddprun::testing::LoopbackPort;
using ddprun::testing::DdprunProcess;
using ddprun::testing::Seconds;

// A socket bound to 127.0.0.1 on a port the kernel picks, listening or not.
LoopbackPort hold_port(bool listening, int& port) {
  LoopbackPort held;
  if (listening) REQUIRE(::listen(held.fd(), 16) == 0);
  port = held.port();
  return held;
}

// ddprun of a one-or-two-node job whose store endpoint is 127.0.0.1:port.
DdprunProcess job_at(int port, const std::string& last_call_timeout = "0.1") {
  return DdprunProcess({"--nnodes=1:2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                        "--rdzv-endpoint=127.0.0.1:" + std::to_string(port),
                        "--rdzv-id=port-" + std::to_string(::getpid()),
                        "--rdzv-conf=last_call_timeout=" + last_call_timeout,
                        "--hang-timeout=0", "/bin/echo", "trained"},
                       {"DDPRUN_RDZV_TOKEN=port-secret"});
}

auto has(const std::string& needle) {
  return [needle](const std::string& s) { return s.find(needle) != std::string::npos; };
}

}  // namespace

TEST_CASE("store port held by a listener that never answers: a warning naming the port, then the "
          "agent hosts the store once it is free") {
  int port = 0;
  LoopbackPort holder = hold_port(true, port);
  DdprunProcess ddprun = job_at(port);
  const std::string taken = "port " + std::to_string(port) + " is taken on this machine";
  REQUIRE(ddprun.wait_for_stderr(has(taken + "; joining the store there"), Seconds(60)));
  // Its connections are accepted (the backlog) and never greeted.
  REQUIRE(ddprun.wait_for_stderr(has(taken + ", but no rendezvous store answers there"), Seconds(120)));
  holder.close();
  const auto end = ddprun.finish(Seconds(120));
  INFO("stderr: " << end.err);
  CHECK(end.status == 0);
  CHECK(has("hosting the rendezvous store at 127.0.0.1:" + std::to_string(port))(end.err));
  CHECK(has("trained")(end.out));
}

TEST_CASE("store port bound by a socket that does not listen: the agent hosts the store once it is "
          "free") {
  int port = 0;
  LoopbackPort holder = hold_port(false, port);
  DdprunProcess ddprun = job_at(port);
  REQUIRE(ddprun.wait_for_stderr(has("port " + std::to_string(port) + " is taken on this machine"),
                                 Seconds(60)));
  holder.close();  // its connections were refused meanwhile
  const auto end = ddprun.finish(Seconds(120));
  INFO("stderr: " << end.err);
  CHECK(end.status == 0);
  CHECK(has("hosting the rendezvous store at 127.0.0.1:" + std::to_string(port))(end.err));
  CHECK(has("trained")(end.out));
}

// The same one-or-two-node job, alone on its machine with its port free: its
// round waits the last call for a second node, and says so once the wait
// has lasted a third of it (it once sat 30 s without a word).
TEST_CASE("a job that may grow says that its round waits the last call for more nodes") {
  int port = 0;
  port = ddprun::testing::free_loopback_port();
  DdprunProcess ddprun = job_at(port, "3");
  const auto end = ddprun.finish(Seconds(120));
  INFO("stderr: " << end.err);
  CHECK(end.status == 0);
  const std::string waits = "round 0 has its minimum of 1 node(s); it forms in ";
  CHECK(end.err.find(waits) != std::string::npos);
  CHECK(end.err.find(waits) == end.err.rfind(waits));  // once
  CHECK(has("or as soon as 2 have joined")(end.err));
  CHECK(has("trained")(end.out));
}
