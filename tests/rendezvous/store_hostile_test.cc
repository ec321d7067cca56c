// The hostile-client suite (ctest label `hostile`): each attack of issue 10
// runs for a bounded time against a real ddprun-store on 127.0.0.1, from
// attacker address 127.0.0.2, while a well-behaved client from 127.0.0.1
// keeps setting, getting and opening fresh connections. Each asserts:
//   - the store's resident memory stays under idle + kRssBound (64 MiB);
//   - every good call and every fresh good connection succeeds throughout.
// The good client's p99 latency is printed here, not asserted (a timing
// threshold would be flaky on a loaded 2-core CI machine); bench/
// store_attack_bench records it next to the idle figure and TCPStore's.
#include <doctest/doctest.h>

#include <future>

#include "rendezvous/server.h"
#include "tests/rendezvous/hostile.h"
#include "tests/rendezvous/store_process.h"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::testing;
using namespace ddprun::rendezvous::hostile;

namespace {

constexpr size_t kRssBound = 64u << 20;
constexpr auto kAttackTime = std::chrono::milliseconds(4000);

struct Outcome {
  size_t idle_rss = 0, peak_rss = 0;
  GoodStats good;
  uint64_t attacker_connects = 0, attacker_closed = 0;
  std::string log;  // the store's
};

// Starts the store, measures idle, runs `attack` (a factory of Attackers)
// with the good client alongside, samples RSS throughout.
Outcome run_attack(const std::vector<std::string>& store_args, const std::string& token,
                   const std::function<std::vector<std::unique_ptr<Attacker>>(uint16_t)>& attack,
                   const std::function<void(Client&)>& prepare = {}) {
  std::vector<std::string> env = {"DDPRUN_STORE_TOKEN"};
  env.push_back(token.empty() ? "DDPRUN_RDZV_TOKEN" : "DDPRUN_RDZV_TOKEN=" + token);
  StoreProcess store(STORE_BIN, store_args, env);
  auto port = store.port();
  REQUIRE(port);
  ClientOptions co;
  co.host = "127.0.0.1";
  co.port = *port;
  co.token = token;
  co.connect_timeout = std::chrono::milliseconds(10000);
  co.op_timeout = std::chrono::milliseconds(10000);
  {
    Client c(co);
    if (prepare) prepare(c);
    c.ping();
  }
  good_client(co, std::chrono::milliseconds(300));  // warm: the idle figure includes a client's traces
  Outcome out;
  out.idle_rss = store.rss();
  {
    auto attackers = attack(*port);
    auto good = std::async(std::launch::async, [&] { return good_client(co, kAttackTime); });
    while (good.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) {
      out.peak_rss = std::max(out.peak_rss, store.rss());
    }
    out.good = good.get();
    for (auto& a : attackers) {
      out.attacker_connects += a->connects();
      out.attacker_closed += a->closed();
    }
  }
  out.peak_rss = std::max(out.peak_rss, store.rss());
  CHECK_FALSE(store.exited());
  out.log = store.log();
  if (getenv("HOSTILE_LOG")) MESSAGE(out.log.substr(out.log.size() > 3000 ? out.log.size() - 3000 : 0));
  MESSAGE("idle RSS " << out.idle_rss / 1048576.0 << " MiB, peak " << out.peak_rss / 1048576.0
                      << " MiB; good: " << out.good.latency_ms.size() << " rounds, p99 "
                      << out.good.p(0.99) << " ms, " << out.good.fresh_ok
                      << " fresh connections; attacker: " << out.attacker_connects
                      << " connects, " << out.attacker_closed << " closed by the store");
  CHECK(store.stop() == 0);
  return out;
}

void check(const Outcome& o) {
  CHECK(o.peak_rss <= o.idle_rss + kRssBound);
  CHECK(o.good.failures == 0);
  INFO("first good-client error: " << o.good.first_error);
  CHECK(o.good.first_error.empty());
  CHECK(o.good.fresh_ok > 0);
}

std::vector<std::unique_ptr<Attacker>> one(AttackOptions o) {
  std::vector<std::unique_ptr<Attacker>> v;
  v.push_back(std::make_unique<Attacker>(std::move(o)));
  return v;
}

}  // namespace

TEST_CASE("hostile: 100 connections without the token send 4 MiB frames before authenticating") {
  auto o = run_attack({}, "s3cret", [](uint16_t port) {
    AttackOptions a;
    a.port = port;
    a.script = partial_big_frame;
    return one(a);
  });
  check(o);
}

TEST_CASE("hostile: 100 connections park 4 MiB partial frames (no token)") {
  auto o = run_attack({}, "", [](uint16_t port) {
    AttackOptions a;
    a.port = port;
    a.script = partial_big_frame;
    return one(a);
  });
  check(o);
  CHECK(o.attacker_closed > 0);  // the buffer limit closed some of them
}

TEST_CASE("hostile: 100 connections block in 4 MiB waits with 4 MiB queued behind (no token)") {
  auto o = run_attack({}, "", [](uint16_t port) {
    AttackOptions a;
    a.port = port;
    a.script = wait_flood;
    return one(a);
  });
  check(o);
  CHECK(o.attacker_closed > 0);
}

TEST_CASE("hostile: 100 connections never read 24 MiB of replies each (no token)") {
  auto o = run_attack(
      {}, "",
      [](uint16_t port) {
        AttackOptions a;
        a.port = port;
        a.drain = false;
        a.script = unread_replies;
        return one(a);
      },
      [](Client& c) { c.set("hostile/big", Bytes(wire::kMaxValueSize, 'b')); });
  // Each gets one reply built and then nothing until it reads (the unread
  // reply timer closes it after 10 s, past this attack).
  check(o);
}

TEST_CASE("hostile: one peer opens 16,384 idle connections") {
  raise_fd_limit();
  for (const std::string token : {"", "s3cret"}) {
    CAPTURE(token);
    auto o = run_attack({}, token, [](uint16_t port) {
      AttackOptions a;
      a.port = port;
      a.connections = 16384;
      return one(a);
    });
    check(o);
    // The per-peer caps turned the flood away (logged a few lines a second).
    CHECK(o.log.find(token.empty() ? "2048 connections from one address is the limit"
                                   : "64 unauthenticated connections from one address") !=
          std::string::npos);
  }
}

TEST_CASE("hostile: tiny keys until the budget is full charge the memory they really take") {
  // A 32 MiB key budget, so the table's whole budget fits the bound.
  auto o = run_attack({"--max-store-bytes", std::to_string(32u << 20)}, "", [](uint16_t port) {
    AttackOptions a;
    a.port = port;
    a.connections = 4;
    a.repeat = true;
    a.script = key_flood;
    return one(a);
  });
  // The good client's sets are refused once the budget is full (the
  // documented behaviour of a token-less store); its memory is what is
  // checked here.
  // (Measured: peak 35 MiB over idle for the 32 MiB budget, filled.)
  CHECK(o.peak_rss <= o.idle_rss + kRssBound);
}
