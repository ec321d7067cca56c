// Death notices: writes a connection leaves with the store for when it
// closes without a goodbye, and the rendezvous ending a round with them.
#include <doctest/doctest.h>

#include "rendezvous/rendezvous.h"
#include "tests/rendezvous/rendezvous_nodes.h"
#include "tests/rendezvous/test_util.h"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::testing;

namespace {

// join, last call, close, keep-alive interval and attempts. The last call
// far beyond the test's waits: only a closed connection can end a round in
// time, and only the live-members rule can close the next one.
constexpr Deadlines kDeadlines{120s, 120s, 5s, 60s, 3};

RendezvousOptions node(int i) { return member(i, 2, 3, kDeadlines); }

}  // namespace

TEST_CASE("a connection's death notice runs when it closes, not after disarming or at shutdown") {
  ServerThread server;
  Client watcher(server.client_options());
  {
    Client dying(server.client_options());
    CHECK(dying.set_on_close({"end", "dead/x"}, {to_bytes("x died"), to_bytes("1")}, "count"));
  }  // closed with the notice armed
  CHECK(to_string(watcher.get("end", 5s)) == "x died");
  CHECK(to_string(watcher.get("dead/x", 0s)) == "1");
  CHECK(watcher.add("count", 0) == 1);

  {  // the first key already set: only the death mark, the end stays
    Client late(server.client_options());
    late.set_on_close({"end", "dead/y", "dead_closed"}, {to_bytes("y died"), to_bytes("1"), to_bytes("y")},
                      "count");
  }
  {  // disarmed on purpose
    Client leaving(server.client_options());
    leaving.set_on_close({"end2"}, {to_bytes("z died")}, "count");
    leaving.set_on_close({}, {}, "");
  }
  CHECK(server.wait_for_state([](ServerThread& s) { return s.connections() == 1; }));
  CHECK(to_string(watcher.get("end", 0s)) == "x died");
  CHECK(to_string(watcher.get("dead/y", 0s)) == "1");
  CHECK_FALSE(watcher.check({"dead_closed"}));
  CHECK_FALSE(watcher.check({"end2"}));
  CHECK(watcher.add("count", 0) == 1);

  // A blocked reader is woken by the notice, as by any write.
  auto blocked = std::async(std::launch::async, [&] {
    Client reader(server.client_options());
    return to_string(reader.get("end3", 10s));
  });
  CHECK(server.wait_for_state([](ServerThread& s) { return s.waiters() == 1; }));
  { Client(server.client_options()).set_on_close({"end3"}, {to_bytes("w died")}, ""); }
  CHECK(blocked.get() == "w died");
}

TEST_CASE("a member whose connection closes ends the round at once; the live ones re-form without a last call") {
  ServerThread server;
  auto factory = [&] { return std::make_unique<Client>(server.client_options()); };
  Rendezvous a(factory, node(1)), b(factory, node(2)), c(factory, node(3));
  for (const auto& r : form({&a, &b, &c})) REQUIRE(r.group_world_size == 3);

  EndWatch ended;
  auto ka = a.watch(ended.callback());
  auto kb = b.watch([](const RoundEnd&) {});
  // c's KeepAlive connection closes without disarming, as when its agent is
  // SIGKILLed: a raw client armed exactly as KeepAlive arms it.
  {
    RoundEnd death;
    death.kind = RoundEnd::kPeerDead;
    death.node = "node3";
    death.reason = "node node3 at 10.0.0.3 (group rank 2) " + std::string(kConnectionClosed);
    Client dying(server.client_options());
    dying.set_on_close({"rdzv/job/r0/end", "rdzv/job/r0/dead/node3", "rdzv/job/r0/dead_closed"},
                       {encode_round_end(death), to_bytes("1"), to_bytes("node3")},
                       "rdzv/job/restarts");
  }
  RoundEnd end = ended.get();
  CHECK(end.kind == RoundEnd::kPeerDead);
  CHECK(end.node == "node3");
  CHECK(a.restart_count() == 1);
  ka.reset();
  kb.reset();

  auto both = form({&a, &b}, 20s);
  const RoundResult& x = both[0];
  const RoundResult& y = both[1];
  CHECK(x.round == 1);
  CHECK(x.group_world_size == 2);
  CHECK(y.group_world_size == 2);
  CHECK(x.group_rank != y.group_rank);
  CHECK(a.restart_count() == 1);
}
