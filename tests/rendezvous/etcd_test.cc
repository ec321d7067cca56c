// The rendezvous on a real etcd (Debian's etcd-server) started by the test
// on loopback: the Store contract over the HTTP/JSON gateway, rounds of two
// and three nodes, dead members (the first one too: no node hosts the
// store), and etcd stopped and restarted. Exits 77 (skipped) without etcd.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <unistd.h>

#include <future>
#include <set>

#include "rendezvous/etcd_store.h"
#include "rendezvous/rendezvous.h"
#include "tests/common/etcd_server.h"
#include "tests/common/temp_dir.h"
#include "tests/rendezvous/rendezvous_nodes.h"
#include "tests/rendezvous/stall_proxy.h"
#include "tests/rendezvous/test_util.h"

using namespace ddprun::rendezvous;
using namespace std::chrono_literals;
using ddprun::rendezvous::testing::form;
using ddprun::testing::TempDir;

namespace {

using Etcd = ddprun::testing::EtcdServer;

// join, last call, close, keep-alive interval and attempts.
constexpr ddprun::rendezvous::testing::Deadlines kDeadlines{30s, 1s, 5s, 300ms, 5};

RendezvousOptions node(int i, int min, int max) {
  RendezvousOptions o = ddprun::rendezvous::testing::member(i, min, max, kDeadlines,
                                                            "job" + std::to_string(getpid()));
  o.local_world_size = 2;
  return o;
}

}  // namespace

TEST_CASE("etcd: the store contract over the HTTP/JSON gateway") {
  Etcd etcd;
  EtcdStore s(etcd.options());
  s.set("a", to_bytes("1"));
  CHECK(to_string(s.get("a", 0ms)) == "1");
  s.set("bin", Bytes{0, 255, 10, 9});
  CHECK(s.get("bin", 0ms) == Bytes{0, 255, 10, 9});
  CHECK(s.add("n", 2) == 2);
  CHECK(s.add("n", -5) == -3);
  CHECK(to_string(s.compare_set("c", {}, to_bytes("x"))) == "x");   // absent -> set
  CHECK(to_string(s.compare_set("c", {}, to_bytes("y"))) == "x");   // present: current value
  CHECK(to_string(s.compare_set("c", to_bytes("x"), to_bytes("z"))) == "z");
  CHECK(s.check({"a", "c"}));
  CHECK_FALSE(s.check({"a", "missing"}));
  CHECK_THROWS_AS(s.get("missing", 100ms), TimeoutError);
  CHECK(s.remove("a"));
  CHECK_FALSE(s.remove("a"));
  CHECK(s.num_keys() >= 3);
  // A write from another client wakes a blocked read.
  auto later = std::async(std::launch::async, [&] {
    EtcdStore w(etcd.options());
    w.set("late", to_bytes("here"));
  });
  CHECK(to_string(s.get("late", 10s)) == "here");
  later.get();
  // Concurrent adds from two clients never lose an increment.
  auto adder = [&] {
    EtcdStore c(etcd.options());
    for (int i = 0; i < 20; ++i) c.add("ctr", 1);
  };
  auto t1 = std::async(std::launch::async, adder), t2 = std::async(std::launch::async, adder);
  t1.get();
  t2.get();
  CHECK(s.add("ctr", 0) == 40);
}

TEST_CASE("etcd: an add whose reply is lost after etcd applied it is not applied twice") {
  // The connection closes after etcd committed the add's transaction and
  // before its answer arrives (a member dying right after the commit). The
  // gateway sends the request again; its compare now fails against our own
  // write, which used to be taken for a lost race and added again.
  Etcd etcd;
  ddprun::rendezvous::testing::StallProxy proxy(etcd.port());
  EtcdOptions o = etcd.options();
  o.endpoints = "127.0.0.1:" + std::to_string(proxy.port());
  EtcdStore s(o);
  s.set_reply_window(10s);  // the window in which an unanswered request is sent again
  CHECK(s.add("n", 5) == 5);
  proxy.lose_reply_to("/v3/kv/txn");
  CHECK(s.add("n", 1) == 6);
  CHECK(proxy.lost_one());
  EtcdStore direct(etcd.options());
  CHECK(to_string(direct.get("n", 0ms)) == "6");
  // The attempt's marker is gone again: only "n" is left.
  CHECK(direct.num_keys() == 1);
}

TEST_CASE("etcd: two and three nodes form one round with unique ranks") {
  Etcd etcd;
  for (int n : {2, 3}) {
    CAPTURE(n);
    std::vector<std::unique_ptr<Rendezvous>> nodes;
    for (int i = 1; i <= n; ++i) {
      auto o = node(i, n, n);
      o.run_id += "-" + std::to_string(n);
      nodes.push_back(std::make_unique<Rendezvous>(
          [&] { return std::make_unique<EtcdStore>(etcd.options()); }, o));
    }
    std::vector<Rendezvous*> raw;
    for (auto& x : nodes) raw.push_back(x.get());
    auto r = form(raw);
    std::set<int> ranks;
    for (const auto& x : r) {
      CHECK(x.group_world_size == n);
      CHECK(x.world_size == 2 * n);
      CHECK(x.round == r[0].round);
      CHECK(x.master_addr == r[0].master_addr);
      ranks.insert(x.group_rank);
    }
    CHECK(ranks.size() == static_cast<size_t>(n));
  }
}

TEST_CASE("etcd: a non-first and then the first node die; the survivors re-form each time") {
  Etcd etcd;
  auto f = [&] { return std::make_unique<EtcdStore>(etcd.options()); };
  Rendezvous a(f, node(1, 1, 3)), b(f, node(2, 1, 3)), c(f, node(3, 1, 3));
  auto first = form({&a, &b, &c});
  REQUIRE(first[0].group_world_size == 3);
  // Node 3 (group rank 2 or not: it is not the first to join) stops
  // heartbeating, as if its host vanished: a and b see it and re-form.
  std::promise<RoundEnd> ended;
  auto ka = a.watch([&](const RoundEnd& e) { ended.set_value(e); });
  auto kb = b.watch([](const RoundEnd&) {});
  auto fut = ended.get_future();
  REQUIRE(fut.wait_for(30s) == std::future_status::ready);
  RoundEnd end = fut.get();
  CHECK(end.kind == RoundEnd::kPeerDead);
  CHECK(end.node == "node3");
  ka.reset();
  kb.reset();
  auto second = form({&a, &b});
  CHECK(second[0].group_world_size == 2);
  CHECK(a.restart_count() == 1);

  // Now node 1, the first to join the job, dies:
  // b alone re-forms (MIN is 1), since no node hosts the store.
  std::promise<RoundEnd> ended2;
  auto kb3 = b.watch([&](const RoundEnd& e) { ended2.set_value(e); });
  auto fut2 = ended2.get_future();
  REQUIRE(fut2.wait_for(30s) == std::future_status::ready);
  CHECK(fut2.get().node == "node1");
  kb3.reset();
  auto third = form({&b});
  CHECK(third[0].group_world_size == 1);
  CHECK(third[0].group_rank == 0);
  CHECK(b.restart_count() == 2);
}

TEST_CASE("etcd: stopped, the store fails with a clear error within its deadline; restarted, it works again") {
  Etcd etcd;
  EtcdStore s(etcd.options());
  s.set("k", to_bytes("v"));
  etcd.stop();
  std::string error;
  try {  // refused at once: a StoreError, not the get's 10 s timeout
    s.get("k", 10s);
  } catch (const StoreError& e) {
    error = e.what();
  }
  CHECK(error.find("etcd range('k') failed at every endpoint (127.0.0.1:") != std::string::npos);
  etcd.start();
  CHECK(to_string(s.get("k", 5s)) == "v");  // same data dir: the key survived
}

TEST_CASE("etcd: a death notice rides on a lease: applied once when it ends, never when cancelled") {
  Etcd etcd;
  EtcdStore watcher(etcd.options());
  {
    EtcdStore dying(etcd.options());
    dying.set_reply_window(2s);  // the lease's TTL
    CHECK(dying.set_on_close({"job/r0/end", "job/r0/dead/x"}, {to_bytes("x died"), to_bytes("1")},
                             "job/count"));
    CHECK(watcher.settle_closed("job/r0/"));  // alive: nothing happens
    CHECK_FALSE(watcher.check({"job/r0/end"}));
  }  // gone without cancelling: the lease is revoked
  CHECK(watcher.settle_closed("job/r0/"));
  CHECK(to_string(watcher.get("job/r0/end", 0ms)) == "x died");
  CHECK(to_string(watcher.get("job/r0/dead/x", 0ms)) == "1");
  CHECK(watcher.add("job/count", 0) == 1);
  // A second notice for the same round finds it ended: no second count,
  // the end stays, and only its death mark is written.
  {
    EtcdStore late(etcd.options());
    late.set_on_close({"job/r0/end", "job/r0/dead/y"}, {to_bytes("y died"), to_bytes("1")}, "job/count");
  }
  watcher.settle_closed("job/r0/");
  watcher.settle_closed("job/r0/");
  CHECK(watcher.add("job/count", 0) == 1);
  CHECK(to_string(watcher.get("job/r0/end", 0ms)) == "x died");
  CHECK(to_string(watcher.get("job/r0/dead/y", 0ms)) == "1");
  // Cancelled (a node that leaves on purpose): nothing is written.
  {
    EtcdStore leaving(etcd.options());
    leaving.set_on_close({"job/r1/end"}, {to_bytes("z died")}, "job/count");
    leaving.set_on_close({}, {}, "");
  }
  watcher.settle_closed("job/r1/");
  CHECK_FALSE(watcher.check({"job/r1/end"}));
  // A lease that expires (SIGKILL: nobody revokes it) fires it too, after its TTL.
  EtcdStore silent(etcd.options());
  silent.set_reply_window(1s);
  silent.set_on_close({"job/r2/end"}, {to_bytes("w went silent")}, "");
  std::string end;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (end.empty() && std::chrono::steady_clock::now() < deadline) {
    watcher.settle_closed("job/r2/");
    try {
      end = to_string(watcher.get("job/r2/end", 200ms));
    } catch (const TimeoutError&) {
    }
  }
  CHECK(end == "w went silent");
}

TEST_CASE("etcd: an endpoint list skips a member that is down, and the error names every one tried") {
  Etcd etcd;
  const uint16_t dead = ddprun::testing::free_loopback_port();  // nobody listens there
  EtcdOptions o = etcd.options();
  o.endpoints = "127.0.0.1:" + std::to_string(dead) + "," + etcd.options().endpoints;
  EtcdStore s(o);
  s.set("k", to_bytes("v"));
  CHECK(to_string(s.get("k", 0ms)) == "v");
  CHECK_FALSE(s.local_address().empty());
  o.endpoints = "127.0.0.1:" + std::to_string(dead) + ",http://127.0.0.1:" + std::to_string(dead);
  EtcdStore none(o);
  std::string error;
  try {
    none.ping();
  } catch (const StoreError& e) {
    error = e.what();
  }
  CHECK(error.find("etcd ping failed at every endpoint") == 0);
  CHECK(error.find("; 127.0.0.1:" + std::to_string(dead) + ": ") != std::string::npos);
  EtcdOptions empty;
  empty.endpoints = "127.0.0.1:1,";
  CHECK_THROWS_AS(EtcdStore{empty}, StoreError);  // an empty endpoint
}

int main(int argc, char** argv) {
  if (!ddprun::testing::etcd_available()) {
    std::puts("SKIP: etcd not found (scripts/setup.sh installs etcd-server)");
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
