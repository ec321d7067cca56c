// The hostile-client suite (ctest label `hostile`): each attack of issue 10
// runs for a bounded time against a real ddprun-store on 127.0.0.1, from
// attacker address 127.0.0.2, while a well-behaved client from 127.0.0.1
// keeps setting, getting and opening fresh connections. The same client
// first runs alone for kIdleTime on the same store: the idle figure of the
// same run. Each attack asserts:
//   - the store's resident memory stays under idle + kRssBound (64 MiB);
//   - every good call and every fresh good connection succeeds throughout;
//   - the good client's p99 set+get latency under attack is at most
//     kP99Factor (200) times its idle p99, the idle p99 counted as at least
//     kIdleFloor (1 ms). A ratio within one run, so a loaded machine slows
//     both sides; generous, because the store shares two cores with the
//     attacker, the good client and up to 8 other jobs. The floor: an idle
//     p99 of 0.1 ms on loopback made one 26 ms scheduling gap on a busy
//     machine fail the run (x263), while a store the attack stalls answers
//     in seconds or not at all (the failures above).
// bench/store_attack_bench.cc reports the same figures next to TCPStore's.
#include <doctest/doctest.h>

#include <algorithm>

#include "base/fd_limit.h"
#include "rendezvous/server.h"
#include "tests/rendezvous/hostile.h"
#include "tests/rendezvous/store_process.h"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::testing;
using namespace ddprun::rendezvous::hostile;

namespace {

constexpr size_t kRssBound = 64u << 20;
constexpr double kP99Factor = 200;
constexpr double kIdleFloorMs = 1.0;
constexpr auto kIdleTime = std::chrono::milliseconds(1000);
constexpr auto kAttackTime = std::chrono::milliseconds(4000);

struct Run {
  std::vector<std::string> store_args;
  std::string token;
  // Runs before the idle phase, on a client of its own.
  std::function<void(Client&)> prepare;
  // Runs under attack, after the good client's measurement.
  std::function<void(StoreProcess&, const ClientOptions&)> during;
};

// Starts the store, measures the good client idle and under `attack`, and
// stops the store (which must still be running, and exit 0).
Measurement run_attack(const Run& run, const std::function<Attackers(uint16_t)>& attack) {
  std::vector<std::string> env = {"DDPRUN_STORE_TOKEN"};
  env.push_back(run.token.empty() ? "DDPRUN_RDZV_TOKEN" : "DDPRUN_RDZV_TOKEN=" + run.token);
  StoreProcess store(STORE_BIN, run.store_args, env);
  auto port = store.port();
  REQUIRE(port);
  ClientOptions co;
  co.host = "127.0.0.1";
  co.port = *port;
  co.token = run.token;
  co.connect_timeout = std::chrono::milliseconds(10000);
  co.op_timeout = std::chrono::milliseconds(10000);
  {
    Client c(co);
    if (run.prepare) run.prepare(c);
    c.ping();
  }
  Measurement m = measure([&] { return store.rss(); },
                          [&](std::chrono::milliseconds d) { return good_client(co, d); },
                          [&] { return attack(*port); }, kIdleTime, kAttackTime,
                          [&] {
                            if (run.during) run.during(store, co);
                          });
  CHECK_FALSE(store.exited());
  std::string log = store.log();
  if (getenv("HOSTILE_LOG")) MESSAGE(log.substr(log.size() > 3000 ? log.size() - 3000 : 0));
  MESSAGE("RSS idle " << m.idle_rss / 1048576.0 << " MiB, peak " << m.peak_rss / 1048576.0
                      << " MiB; good p99 idle " << m.idle.p(0.99) << " ms, under attack "
                      << m.attack.p(0.99) << " ms (x" << m.p99_ratio() << "; p50 " << m.attack.p(0.5)
                      << " ms), " << m.attack.latency_ms.size() << " rounds, " << m.attack.fresh_ok
                      << " fresh connections (p99 " << m.attack.connect_p(0.99) << " ms), "
                      << m.attack.failures << " failures; attacker: " << m.attacker_connects
                      << " connects, " << m.attacker_closed << " closed by the store");
  CHECK(store.stop() == 0);
  return m;
}

void check(const Measurement& m) {
  CHECK(m.established);  // the attack was in full force while measured
  CHECK(m.peak_rss <= m.idle_rss + kRssBound);
  INFO("first good-client error: " << m.attack.first_error);
  CHECK(m.attack.failures == 0);
  CHECK(m.attack.fresh_ok > 0);
  CHECK(m.idle.failures == 0);
  CHECK(m.attack.p(0.99) <= kP99Factor * std::max(m.idle.p(0.99), kIdleFloorMs));
}

Attackers one(AttackOptions o) {
  Attackers v;
  v.push_back(std::make_unique<Attacker>(std::move(o)));
  return v;
}

}  // namespace

TEST_CASE("hostile: 100 connections without the token send 4 MiB frames before authenticating") {
  auto m = run_attack({{}, "s3cret", {}, {}}, [](uint16_t port) {
    AttackOptions a;
    a.port = port;
    a.script = partial_big_frame;
    return one(a);
  });
  check(m);
}

TEST_CASE("hostile: 100 connections park 4 MiB partial frames (no token)") {
  auto m = run_attack({}, [](uint16_t port) {
    AttackOptions a;
    a.port = port;
    a.script = partial_big_frame;
    return one(a);
  });
  check(m);
}

TEST_CASE("hostile: 100 connections block in 4 MiB waits with 4 MiB queued behind (no token)") {
  auto m = run_attack({}, [](uint16_t port) {
    AttackOptions a;
    a.port = port;
    a.script = wait_flood;
    return one(a);
  });
  check(m);
}

TEST_CASE("hostile: 100 connections never read 24 MiB of replies each (no token)") {
  Run run;
  run.prepare = [](Client& c) { c.set("hostile/big", Bytes(wire::kMaxValueSize, 'b')); };
  auto m = run_attack(run, [](uint16_t port) {
    AttackOptions a;
    a.port = port;
    a.drain = false;
    a.script = unread_replies;
    return one(a);
  });
  // Each gets one reply built and then nothing until it reads (the unread
  // reply timer closes it after 10 s, past this attack).
  check(m);
}

TEST_CASE("hostile: one peer opens 16,384 idle connections") {
  ddprun::base::raise_fd_limit();
  for (const std::string token : {"", "s3cret"}) {
    CAPTURE(token);
    std::string log;
    Run run{{}, token, {}, {}};
    run.during = [&](StoreProcess& store, const ClientOptions&) { log = store.log(); };
    auto m = run_attack(run, [](uint16_t port) {
      AttackOptions a;
      a.port = port;
      a.connections = 16384;
      return one(a);
    });
    check(m);
    // The per-peer caps turned the flood away (logged a few lines a second).
    CHECK(log.find(token.empty() ? "2048 connections from one address is the limit"
                                 : "64 unauthenticated connections from one address") !=
          std::string::npos);
  }
}

TEST_CASE("hostile: tiny keys fill the key budget, which charges the memory they really take") {
  // A 16 MiB budget (--max-store-bytes), so four connections fill it
  // within the attack and the table's whole budget fits the bound.
  constexpr size_t kBudget = 16u << 20;
  bool filled = false;
  std::string refusal;
  size_t rss_full = 0;
  Run run;
  run.store_args = {"--max-store-bytes", std::to_string(kBudget)};
  // The good client's 64 keys exist before the flood, so its sets (same
  // size) still fit once the budget is full; a new key must be refused.
  run.during = [&](StoreProcess& store, const ClientOptions& co) {
    Client probe(co);
    auto deadline = Clock::now() + std::chrono::seconds(30);
    for (uint64_t i = 0; !filled && Clock::now() < deadline; ++i) {
      try {
        probe.set("probe/" + std::to_string(i), Bytes{'p'});
        probe.ping();  // set is answered lazily: the ping brings its refusal
      } catch (const StoreError& e) {
        refusal = e.what();
        filled = refusal.find("store full") != std::string::npos;
        rss_full = store.rss();
        if (!filled) break;
      }
    }
  };
  auto m = run_attack(run, [](uint16_t port) {
    AttackOptions a;
    a.port = port;
    a.connections = 4;
    a.repeat = true;
    a.script = key_flood;
    return one(a);
  });
  check(m);
  INFO("the probe's refusal: " << refusal);
  CHECK(filled);
  MESSAGE("budget full at RSS " << rss_full / 1048576.0 << " MiB (idle " << m.idle_rss / 1048576.0
                                << " MiB, budget " << kBudget / 1048576.0 << " MiB)");
  // At that point the table holds the whole budget, and the store stays
  // within what its limits promise: idle + key budget + buffer cap.
  CHECK(rss_full <= m.idle_rss + kBudget + wire::kMaxBufferedBytes);
  CHECK(rss_full <= m.idle_rss + kRssBound);
}

TEST_CASE("hostile: 16 waits on 8,192 keys each while a client sets and deletes those keys in a loop") {
  // Before issue 19 every write rescanned every wait's whole key list on
  // the event loop (16 x 8,192 per write): the good client stalled for
  // seconds. Now a write touches the waits on its key only.
  std::string probe;
  Run run;
  run.during = [&](StoreProcess&, const ClientOptions& co) {
    // The waits are really parked: the key only they wait for is absent,
    // and the store still answers a wait of its own on a shared key.
    Client c(co);
    probe = c.check({"q/never/0"}) ? "q/never/0 exists" : "";
    c.set("q/0", Bytes{'g'});
    c.wait({"q/0"}, std::chrono::milliseconds(10000));
  };
  auto m = run_attack(run, [](uint16_t port) {
    Attackers v;
    AttackOptions waits;
    waits.port = port;
    waits.connections = 16;
    waits.script = wait_on_many;
    v.push_back(std::make_unique<Attacker>(waits));
    AttackOptions writes;
    writes.port = port;
    writes.source = "127.0.0.3";
    writes.connections = 1;
    writes.repeat = true;
    writes.script = set_delete_loop;
    v.push_back(std::make_unique<Attacker>(writes));
    return v;
  });
  check(m);
  CHECK(probe.empty());
}

namespace {
// Connects from 127.0.0.1 once (no retry) and reads the first frame: true
// when it is the greeting, false when the store closed the connection
// at accept (a refused slot) or said nothing within 10 s.
bool greeted_first_time(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  Bytes got;
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (ok && got.size() < 4 + 38 && Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    uint8_t buf[256];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.insert(got.end(), buf, buf + n);
  }
  ::close(fd);
  return got.size() >= 8 && std::equal(got.begin() + 4, got.begin() + 8, wire::kMagic);
}
}  // namespace

TEST_CASE("hostile: 16 addresses in 16 subnets hold every unauthenticated slot and reconnect when closed") {
  // 16 x 64 = 1,024: every pre-authentication slot, each address at its
  // own cap. Before issue 19 the store refused everyone else at accept;
  // now a newcomer evicts the oldest of the biggest holder, and the good
  // client (one slot at a time) is never the biggest.
  std::string log;
  Run run{{}, "s3cret", {}, {}};
  size_t greeted = 0;
  run.during = [&](StoreProcess& store, const ClientOptions& co) {
    for (int i = 0; i < 50; ++i) greeted += greeted_first_time(co.port);
    log = store.log();
  };
  static std::vector<std::string> sources;
  for (int n = 1; n <= 16; ++n) sources.push_back("127.0." + std::to_string(n) + ".2");
  auto m = run_attack(run, [](uint16_t port) {
    Attackers v;
    for (const auto& src : sources) {
      AttackOptions a;
      a.port = port;
      a.source = src.c_str();
      a.connections = wire::kMaxUnauthenticatedPerPeer;
      v.push_back(std::make_unique<Attacker>(a));
    }
    return v;
  });
  check(m);
  // Every connection of the good address got a slot at its first try.
  CHECK(greeted == 50);
  CHECK(log.find("to make room for 127.0.0.1") != std::string::npos);
}
