// The keep-alive under injected delay: a store that stalls for less than
// the window (keep_alive_interval x keep_alive_max_attempt) does not end
// the round, though one reply then takes longer than a client's default
// grace; one silent for longer is reported lost. The stall comes from a
// proxy in front of a real store.
#include <doctest/doctest.h>

#include "rendezvous/rendezvous.h"
#include "tests/rendezvous/rendezvous_nodes.h"
#include "tests/rendezvous/stall_proxy.h"
#include "tests/rendezvous/test_util.h"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::testing;

namespace {

// Store clients as the agent makes them, with the default reply grace: a
// blocked call gives up on a reply 2.5 s after it was sent.
Rendezvous::StoreFactory through(uint16_t port) { return loopback_clients(port, 10s, 10s); }

// join, last call, close, keep-alive interval and attempts: a 6 s window.
constexpr Deadlines kDeadlines{20s, 300ms, 2s, 1s, 6};

RendezvousOptions node(int i) {
  RendezvousOptions o = member(i, 2, 2, kDeadlines, "ka");
  o.master_port = 29500 + i;
  return o;
}

}  // namespace

TEST_CASE("a store stall longer than a reply's grace but inside the keep-alive window ends nothing") {
  ServerThread server;
  StallProxy proxy(server.port());
  Rendezvous a(through(proxy.port()), node(1));
  Rendezvous b(through(proxy.port()), node(2));
  form({&a, &b});
  EndWatch ea, eb;
  auto ka = a.watch(ea.callback());
  auto kb = b.watch(eb.callback());
  proxy.stall(true);
  // 3.5 s: past the 2.5 s after which a blocked call gives up on its reply
  // (what used to end the round), inside the 6 s window.
  bool ended = ea.future.wait_for(3500ms) == std::future_status::ready;
  proxy.stall(false);
  CHECK_FALSE(ended);
  // Both nodes heartbeat again: nothing ends within another full window.
  CHECK(ea.future.wait_for(7s) == std::future_status::timeout);
  CHECK(eb.future.wait_for(0s) == std::future_status::timeout);
  // The watch still works: b stops, a declares it dead.
  kb.reset();
  REQUIRE(ea.future.wait_for(20s) == std::future_status::ready);
  CHECK(ea.future.get().kind == RoundEnd::kPeerDead);
}

TEST_CASE("a store silent for longer than the keep-alive window is reported lost") {
  ServerThread server;
  StallProxy proxy(server.port());
  RendezvousOptions o = node(1);
  o.min_nodes = o.max_nodes = 1;
  o.keep_alive_max_attempt = 3;  // window 3 s
  Rendezvous a(through(proxy.port()), o);
  a.next_round();
  EndWatch ea;
  auto start = std::chrono::steady_clock::now();
  auto ka = a.watch(ea.callback());
  proxy.stall(true);
  RoundEnd end = ea.get(30s);
  CHECK(end.kind == RoundEnd::kStoreLost);
  CHECK(end.reason.find("did not answer") != std::string::npos);
  // Not before the window (the bound after it is the client's own deadlines).
  CHECK(std::chrono::steady_clock::now() - start >= 3s);
  proxy.stall(false);
}
