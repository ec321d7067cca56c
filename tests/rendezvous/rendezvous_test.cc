// The rendezvous protocol with several participants (threads, each with its
// own store connections) on a real store server on 127.0.0.1.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <set>

#include "rendezvous/rendezvous.h"
#include "rendezvous/succession.h"
#include "tests/rendezvous/rendezvous_nodes.h"
#include "tests/rendezvous/test_util.h"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::testing;

namespace {

Rendezvous::StoreFactory factory(uint16_t port) { return loopback_clients(port, 1s, 2s, 1s); }

// join, last call, close, keep-alive interval and attempts. The keep-alive
// generous enough that a loaded CI machine never starves a heartbeat into a
// false death.
constexpr Deadlines kDeadlines{20s, 300ms, 2s, 200ms, 5};

RendezvousOptions node(int i, int min, int max) {
  RendezvousOptions o = member(i, min, max, kDeadlines);
  o.local_world_size = 2;
  o.master_port = 29500 + i;
  return o;
}

}  // namespace

TEST_CASE("three nodes form one round with unique ranks and one master") {
  ServerThread server;
  Rendezvous a(factory(server.port()), node(1, 3, 3));
  Rendezvous b(factory(server.port()), node(2, 3, 3));
  Rendezvous c(factory(server.port()), node(3, 3, 3));
  auto r = form({&a, &b, &c});
  std::set<int> group_ranks, bases;
  for (const auto& x : r) {
    CHECK(x.round == r[0].round);
    CHECK(x.group_world_size == 3);
    CHECK(x.world_size == 6);
    CHECK(x.rank_base == 2 * x.group_rank);
    CHECK(x.store_prefix == r[0].store_prefix);
    CHECK(x.master_addr == r[0].master_addr);
    CHECK(x.master_port == r[0].master_port);
    group_ranks.insert(x.group_rank);
    bases.insert(x.rank_base);
  }
  CHECK(group_ranks == std::set<int>{0, 1, 2});
  // the master is group rank 0's own address and port
  auto master = std::find_if(r.begin(), r.end(), [](const RoundResult& x) { return x.group_rank == 0; });
  int i = static_cast<int>(master - r.begin()) + 1;
  CHECK(master->master_addr == "10.0.0." + std::to_string(i));
  CHECK(master->master_port == 29500 + i);
}

TEST_CASE("a node's keep-alive connection is made as it joins, not when its round forms") {
  // Every node of a round gets it at the same moment: connecting then was
  // N connections and handshakes at once (issue 24).
  ServerThread server;
  std::atomic<int> made{0};
  std::promise<void> first;
  auto connect = factory(server.port());
  Rendezvous a(connect, node(1, 2, 2), [&] {
    if (made++ == 0) first.set_value();
    return connect();
  });
  Rendezvous b(factory(server.port()), node(2, 2, 2));
  auto joined = std::async(std::launch::async, [&] { return a.next_round(); });
  REQUIRE(first.get_future().wait_for(20s) == std::future_status::ready);
  CHECK(joined.wait_for(0s) != std::future_status::ready);  // the round needs b
  b.next_round();
  REQUIRE(joined.wait_for(20s) == std::future_status::ready);
  joined.get();
  auto keep_alive = a.watch([](const RoundEnd&) {});
  CHECK(made == 1);  // watch() took the connection made at the join
}

TEST_CASE("a round closes at MIN nodes after the last call") {
  ServerThread server;
  Rendezvous a(factory(server.port()), node(1, 2, 3));
  Rendezvous b(factory(server.port()), node(2, 2, 3));
  auto r = form({&a, &b});
  CHECK(r[0].group_world_size == 2);
  CHECK(r[1].group_world_size == 2);
  CHECK(r[0].world_size == 4);
  CHECK(r[0].group_rank != r[1].group_rank);
}

RoundEnd failed(const std::string& node, int status, const std::string& reason) {
  RoundEnd e;
  e.kind = RoundEnd::kFailed;
  e.node = node;
  e.exit_status = status;
  e.reason = reason;
  return e;
}

TEST_CASE("a failure signal ends the round for every node and counts one job-wide restart") {
  ServerThread server;
  Rendezvous a(factory(server.port()), node(1, 3, 3));
  Rendezvous b(factory(server.port()), node(2, 3, 3));
  Rendezvous c(factory(server.port()), node(3, 3, 3));
  form({&a, &b, &c});
  EndWatch ea, eb, ec;
  auto ka = a.watch(ea.callback());
  auto kb = b.watch(eb.callback());
  auto kc = c.watch(ec.callback());
  b.signal_failure(failed("node2", 3, "worker 1 exited with 3"));
  for (EndWatch* e : {&ea, &eb, &ec}) {
    RoundEnd end = e->get();
    CHECK(end.kind == RoundEnd::kFailed);
    CHECK(end.node == "node2");
    CHECK(end.exit_status == 3);
    CHECK(end.signal == 0);
    CHECK_FALSE(end.store_closes);
    CHECK(end.spends_restart());
  }
  c.signal_failure(failed("node3", 4, "a second report of the same round"));
  CHECK(a.restart_count() == 1);
  // everyone re-forms; the group ranks stay
  auto again = form({&a, &b, &c});
  CHECK(again[0].round == again[1].round);
  CHECK(again[0].group_world_size == 3);
}

TEST_CASE("group ranks stay the same for nodes that remain") {
  ServerThread server;
  std::vector<std::unique_ptr<Rendezvous>> n;
  for (int i = 1; i <= 3; ++i) n.push_back(std::make_unique<Rendezvous>(factory(server.port()), node(i, 2, 3)));
  auto first = form({n[0].get(), n[1].get(), n[2].get()});
  // find the node with group rank 2 and drop it after a failure
  int leaving = static_cast<int>(std::find_if(first.begin(), first.end(), [](auto& r) { return r.group_rank == 2; }) - first.begin());
  n[leaving]->signal_failure(failed(n[leaving]->node_id(), 1, "node leaves"));
  n.erase(n.begin() + leaving);
  first.erase(first.begin() + leaving);
  // rejoin in reverse order of the previous ranks
  std::vector<Rendezvous*> order = {n[0].get(), n[1].get()};
  if (first[0].group_rank < first[1].group_rank) std::swap(order[0], order[1]);
  auto second = form(order);
  for (size_t i = 0; i < 2; ++i) {
    size_t j = order[i] == n[0].get() ? 0 : 1;
    CHECK(second[i].group_rank == first[j].group_rank);
    CHECK(second[i].world_size == 4);
    CHECK(second[i].round > first[j].round);
  }
}

TEST_CASE("the stable rank rule keeps previous ranks and fills holes in join order") {
  auto n = [](std::string id, int64_t seq) { return NodeInfo{id, "a", 1, 1, seq}; };
  std::vector<NodeInfo> previous = {n("x", 3), n("y", 1), n("z", 2)};
  // z (rank 2) and a newcomer w remain with y: y keeps 1, then w and z fill
  auto out = assign_ranks({n("z", 2), n("w", 4), n("y", 1)}, previous);
  REQUIRE(out.size() == 3);
  CHECK(out[1].node_id == "y");
  CHECK(out[2].node_id == "z");
  CHECK(out[0].node_id == "w");
  // previous rank beyond the new size: moved to the first hole in seq order
  auto two = assign_ranks({n("z", 2), n("x", 3)}, previous);
  CHECK(two[0].node_id == "x");
  CHECK(two[1].node_id == "z");
  // no history: seq order
  auto fresh = assign_ranks({n("b", 9), n("a", 5)}, {});
  CHECK(fresh[0].node_id == "a");
}

TEST_CASE("each member's assignment names its rank, the sizes, the master and its next four peers") {
  std::vector<NodeInfo> members;
  for (int i = 0; i < 6; ++i)
    members.push_back({"n" + std::to_string(i), "10.0.0." + std::to_string(i), 29500 + i, i + 1, i});
  auto each = assignments(members);
  REQUIRE(each.size() == 6);
  CHECK(each[3].group_rank == 3);
  CHECK(each[3].group_world_size == 6);
  CHECK(each[3].rank_base == 1 + 2 + 3);
  CHECK(each[3].world_size == 21);
  CHECK(each[3].master_addr == "10.0.0.0");
  CHECK(each[3].master_port == 29500);
  // a ring: rank 3 watches 4, 5, 0, 1
  REQUIRE(each[3].watched.size() == kWatchedPeers);
  CHECK(each[3].watched[2].group_rank == 0);
  CHECK(each[3].watched[2].node.node_id == "n0");
  // the record decodes to what was encoded
  auto back = decode_assignment(encode_assignment(each[3]));
  REQUIRE(back);
  CHECK(encode_assignment(*back) == encode_assignment(each[3]));
  CHECK(back->watched[3].node.addr == "10.0.0.1");
  // two members watch each other only
  auto two = assignments({members[0], members[1]});
  REQUIRE(two[1].watched.size() == 1);
  CHECK(two[1].watched[0].group_rank == 0);
}

TEST_CASE("every assignment names the store's successor: the lowest group rank not hosting it") {
  std::vector<NodeInfo> members;
  for (int i = 0; i < 4; ++i) members.push_back({"n" + std::to_string(i), "10.0.0." + std::to_string(i), 1, 1, i});
  for (const auto& [host, successor] : std::vector<std::pair<std::string, std::string>>{
           {"n0", "n1"}, {"n1", "n0"}, {"n3", "n0"}}) {
    CAPTURE(host);
    for (const auto& a : assignments(members, host)) {
      REQUIRE(a.successor);
      CHECK(a.successor->node_id == successor);
      auto back = decode_assignment(encode_assignment(a));
      REQUIRE(back);
      REQUIRE(back->successor);
      CHECK(back->successor->addr == a.successor->addr);
    }
  }
  // No member hosts the store (ddprun-store, or no announcement): none.
  for (const std::string& host : {std::string(), std::string("elsewhere")})
    for (const auto& a : assignments(members, host)) CHECK_FALSE(a.successor);
  // The host alone: nobody to succeed it.
  CHECK_FALSE(assignments({members[0]}, "n0")[0].successor);
  Bytes bad_successor = encode_assignment(assignments(members, "n0")[1]);
  bad_successor.resize(bad_successor.size() - 1);  // the successor's seq, cut short
  CHECK_FALSE(decode_assignment(bad_successor));
}

TEST_CASE("a successor's store preloaded with the takeover records re-forms the survivors") {
  // Round 0 forms on the first store with three nodes, node1 hosting it.
  // The successor's Standby of it preloads a second store, which the two
  // survivors join: their round forms at once (the host is known dead, and
  // a 60 s last call could not close it in time), their group ranks kept
  // where they fit, one restart spent, node1 out.
  auto first = std::make_unique<ServerThread>();
  auto port = std::make_shared<std::atomic<uint16_t>>(first->port());
  Rendezvous::StoreFactory switchable = [port] { return factory(*port)(); };
  std::vector<std::unique_ptr<Rendezvous>> nodes;
  for (int i = 1; i <= 3; ++i) {
    RendezvousOptions o = node(i, 2, 3);
    o.last_call_timeout = std::chrono::seconds(60);
    o.hosts_store = i == 1;
    nodes.push_back(std::make_unique<Rendezvous>(switchable, o));
  }
  const auto r0 = form({nodes[0].get(), nodes[1].get(), nodes[2].get()});
  for (const auto& r : r0) {
    REQUIRE(r.successor);
    CHECK(r.successor->node_id == r0[1].successor->node_id);
    CHECK(r.successor->node_id != "node1");
  }
  const size_t s = r0[1].successor->node_id == "node2" ? 1 : 2;
  CHECK(r0[s].group_rank == (r0[0].group_rank == 0 ? 1 : 0));  // the lowest rank not hosting
  auto reader = factory(first->port())();
  const Standby standby = read_standby(*reader, nodes[s]->keys(), r0[s]);
  CHECK(standby.members.size() == 3);
  CHECK(standby.store_host == "node1");
  CHECK(standby.restarts == 0);
  reader.reset();
  nodes[0].reset();  // the host's agent and its store go
  first.reset();
  ServerThread second;
  second.preload(takeover_records(nodes[s]->keys(), standby, *r0[s].successor));
  *port = second.port();
  for (size_t i : {size_t(1), size_t(2)}) nodes[i]->reconnect();
  const auto r1 = form({nodes[1].get(), nodes[2].get()}, std::chrono::seconds(30));
  for (size_t i : {size_t(0), size_t(1)}) {
    CHECK(r1[i].round == r0[0].round + 1);
    CHECK(r1[i].group_world_size == 2);
  }
  CHECK(r1[0].group_rank != r1[1].group_rank);
  // Whoever kept a rank below 2 keeps it.
  for (size_t i : {size_t(1), size_t(2)})
    if (r0[i].group_rank < 2) CHECK(r1[i - 1].group_rank == r0[i].group_rank);
  CHECK(nodes[1]->restart_count() == 1);
  // The next round's successor: the new host (the successor) announced.
  for (const auto& r : r1) {
    REQUIRE(r.successor);
    CHECK(r.successor->node_id != r0[s].successor->node_id);
  }
}

TEST_CASE("an assignment record that is not one is refused") {
  const auto two = assignments({{"a", "h", 1, 1, 1}, {"b", "h", 1, 1, 2}}, "a");
  const Bytes good = encode_assignment(two[1]);
  REQUIRE(decode_assignment(good));
  for (size_t n = 0; n < good.size(); ++n) {
    CAPTURE(n);
    CHECK_FALSE(decode_assignment(Bytes(good.begin(), good.begin() + n)));
  }
  auto damaged = [&](size_t at, uint8_t value) {
    Bytes b = good;
    b[at] = value;
    return b;
  };
  Bytes trailing = good;
  trailing.push_back(0);
  // The header is magic, version, then group rank, group world size, rank
  // base and world size (u32 each): group rank 1 of 1, a negative size, a
  // successor flag of 2 (the last node's 20 bytes after it), and the text
  // this record was before.
  for (const Bytes& bad :
       {trailing, damaged(11, 1), damaged(8, 0x80), damaged(good.size() - 21, 2),
        to_bytes("0\t1\t0\t1\th\t1\n")}) {
    CAPTURE(bad.size());
    CHECK_FALSE(decode_assignment(bad));
  }
  // Ids and addresses are never cut: an id too long to write is refused.
  Assignment long_id = two[1];
  long_id.successor->node_id = std::string(5000, 'n');
  CHECK_THROWS_AS(encode_assignment(long_id), RecordError);
}

TEST_CASE("a node record and the members record read back field for field") {
  const std::vector<NodeInfo> nodes{{"n0", "10.0.0.1", 29500, 8, 1}, {"n\t1", "::1", 0, 1, (int64_t{1} << 40) + 3}};
  const auto one = decode_node(encode_node(nodes[1]));
  REQUIRE(one);
  CHECK(one->node_id == "n\t1");
  CHECK(one->seq == nodes[1].seq);
  const auto back = decode_nodes(encode_nodes(nodes));
  REQUIRE(back.size() == 2);
  CHECK(back[0].addr == "10.0.0.1");
  CHECK(back[0].master_port == 29500);
  CHECK(back[0].local_world_size == 8);
  CHECK(back[1].addr == "::1");
  // A members record is read whole or not at all.
  Bytes cut = encode_nodes(nodes);
  cut.pop_back();
  CHECK(decode_nodes(cut).empty());
  CHECK_FALSE(decode_node(encode_nodes(nodes)));
}

TEST_CASE("a node whose heartbeats stop is declared dead by the others") {
  ServerThread server;
  Rendezvous a(factory(server.port()), node(1, 2, 2));
  Rendezvous b(factory(server.port()), node(2, 2, 2));
  form({&a, &b});
  EndWatch ea, eb;
  auto ka = a.watch(ea.callback());
  auto kb = b.watch(eb.callback());
  kb.reset();  // b stops heartbeating, as if its host vanished
  RoundEnd end = ea.get();
  CHECK(end.kind == RoundEnd::kPeerDead);
  CHECK(end.node == "node2");
  CHECK(end.exit_status == 1);
  CHECK(end.reason.find("node node2 at 10.0.0.2") != std::string::npos);  // names the address
  CHECK(a.restart_count() == 1);
}

TEST_CASE("a late node is taken in at the next round without spending a restart") {
  ServerThread server;
  Rendezvous a(factory(server.port()), node(1, 2, 3));
  Rendezvous b(factory(server.port()), node(2, 2, 3));
  Rendezvous c(factory(server.port()), node(3, 2, 3));
  auto first = form({&a, &b});
  EndWatch ea, eb;
  auto ka = a.watch(ea.callback());
  auto kb = b.watch(eb.callback());
  auto late = std::async(std::launch::async, [&] { return c.next_round(); });
  RoundEnd end = ea.get();
  CHECK(end.kind == RoundEnd::kScaleUp);
  CHECK(end.node == "node3");
  CHECK(end.reason.find("node3 at 10.0.0.3") != std::string::npos);
  CHECK_FALSE(end.spends_restart());
  CHECK(eb.get().kind == RoundEnd::kScaleUp);
  ka.reset();
  kb.reset();
  auto second = form({&a, &b});
  RoundResult rc = late.get();
  CHECK(rc.group_world_size == 3);
  CHECK(rc.world_size == 6);
  CHECK(rc.group_rank == 2);
  CHECK(second[0].group_rank == first[0].group_rank);
  CHECK(second[1].group_rank == first[1].group_rank);
  CHECK(a.restart_count() == 0);
}

TEST_CASE("join timeout says how many nodes came and from where") {
  ServerThread server;
  auto o = node(1, 2, 3);
  o.join_timeout = 300ms;
  Rendezvous a(factory(server.port()), o);
  CHECK_THROWS_WITH_AS(a.next_round(),
                       doctest::Contains("1 of 2 required nodes joined within join_timeout 300 ms (node1 at 10.0.0.1)"),
                       RendezvousError);
}

TEST_CASE("a dead store host ends the round with an error naming its address") {
  auto server = std::make_unique<ServerThread>();
  std::string addr = "127.0.0.1:" + std::to_string(server->port());
  Rendezvous a(factory(server->port()), node(1, 1, 1));
  a.next_round();
  EndWatch ea;
  auto ka = a.watch(ea.callback());
  server.reset();
  RoundEnd end = ea.get();
  CHECK(end.kind == RoundEnd::kStoreLost);
  CHECK(end.reason.find(addr) != std::string::npos);
  CHECK_THROWS_WITH_AS(a.next_round(), doctest::Contains(addr.c_str()), RendezvousError);
}

TEST_CASE("--rdzv-conf keys are torchrun's, and bad ones are named") {
  RendezvousOptions o;
  apply_rdzv_conf({{"join_timeout", "12"}, {"last_call_timeout", "0.5"}, {"keep_alive_interval", "2"},
                   {"keep_alive_max_attempt", "4"}, {"is_host", "false"}, {"close_timeout", "7"},
                   {"token", "ignored-here"}},
                  o);
  CHECK(o.join_timeout == 12s);
  CHECK(o.last_call_timeout == 500ms);
  CHECK(o.keep_alive_interval == 2s);
  CHECK(o.keep_alive_max_attempt == 4);
  CHECK(o.close_timeout == 7s);
  CHECK_FALSE(o.is_host);
  CHECK_THROWS_WITH_AS(apply_rdzv_conf({{"join_timeout", "soon"}}, o),
                       doctest::Contains("join_timeout=soon"), RendezvousError);
  CHECK_THROWS_WITH_AS(apply_rdzv_conf({{"keep_alive_max_attempt", "0"}}, o),
                       doctest::Contains("keep_alive_max_attempt=0"), RendezvousError);
  CHECK_THROWS_WITH_AS(apply_rdzv_conf({{"joint_timeout", "1"}}, o),
                       doctest::Contains("unknown key 'joint_timeout'"), RendezvousError);
  RendezvousOptions defaults;
  CHECK(defaults.join_timeout == 600s);
  CHECK(defaults.last_call_timeout == 30s);
  CHECK(defaults.keep_alive_interval == 5s);
  CHECK(defaults.keep_alive_max_attempt == 3);
}

TEST_CASE("without --local-addr, the master address is where the store connection leaves from") {
  ServerThread server;
  auto o = node(1, 1, 1);
  o.local_addr.clear();
  Rendezvous a(factory(server.port()), o);
  CHECK(a.next_round().master_addr == "127.0.0.1");
}

TEST_CASE("a node that vanishes during the last call does not stall the round") {
  ServerThread server;
  auto o = node(1, 2, 3);
  o.join_timeout = 10s;
  Rendezvous a(factory(server.port()), o);
  auto formed = std::async(std::launch::async, [&] { return a.next_round(); });
  // a takes slot 1 and waits for a second node
  Client ghost(server.client_options());
  ghost.wait({"rdzv/job/r0/node/1"}, 10s);
  // the second node records itself and dies before closing the round
  REQUIRE(ghost.add("rdzv/job/r0/joined", 1) == 2);
  ghost.set("rdzv/job/r0/node/2", encode_node({"ghost", "10.0.0.9", 1, 2, 99}));
  RoundResult r = formed.get();
  CHECK(r.group_world_size == 2);
  CHECK(r.group_rank == 0);  // first-join order
  REQUIRE(r.watched.size() == 1);
  CHECK(r.watched[0].node.node_id == "ghost");
  auto members = read_members(ghost, a.keys(), r);
  REQUIRE(members.size() == 2);
  CHECK(members[0].node_id == "node1");
  CHECK(members[1].node_id == "ghost");
}
