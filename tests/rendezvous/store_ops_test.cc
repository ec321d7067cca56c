// Every store operation's semantics, on the TCP client against a real
// server on 127.0.0.1 and on the in-memory twin.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <atomic>

#include "tests/rendezvous/test_util.h"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::testing;

namespace {

void exercise(Store& s) {
  SUBCASE("set then get returns the value; set overwrites") {
    s.set("a", B("1"));
    CHECK(s.get("a", 1s) == B("1"));
    s.set("a", B("22"));
    CHECK(s.get("a", 1s) == B("22"));
  }
  SUBCASE("add counts from zero and returns the new value") {
    CHECK(s.add("n", 5) == 5);
    CHECK(s.add("n", -7) == -2);
    CHECK(s.get("n", 1s) == B("-2"));
  }
  SUBCASE("add on a non-integer value is an error naming the key") {
    s.set("text", B("abc"));
    CHECK_THROWS_WITH_AS(s.add("text", 1), doctest::Contains("'text'"), StoreError);
  }
  SUBCASE("add past the int64 range is an error naming the key; the value stays") {
    s.add("big", INT64_MAX);
    CHECK_THROWS_WITH_AS(s.add("big", 1), doctest::Contains("'big'"), StoreError);
    CHECK(s.get("big", 1s) == B(std::to_string(INT64_MAX)));
  }
  SUBCASE("compare_set") {
    // absent + empty expected: sets
    CHECK(s.compare_set("c", {}, B("x")) == B("x"));
    // mismatch: unchanged, returns the current value
    CHECK(s.compare_set("c", B("nope"), B("y")) == B("x"));
    CHECK(s.get("c", 1s) == B("x"));
    // match: swaps
    CHECK(s.compare_set("c", B("x"), B("y")) == B("y"));
    CHECK(s.get("c", 1s) == B("y"));
    // absent + non-empty expected: stays absent
    CHECK(s.compare_set("absent", B("e"), B("d")).empty());
    CHECK_FALSE(s.check({"absent"}));
  }
  SUBCASE("check, remove, num_keys") {
    int64_t before = s.num_keys();
    s.set("p", B("1"));
    s.set("q", B("2"));
    CHECK(s.check({"p", "q"}));
    CHECK_FALSE(s.check({"p", "zz"}));
    CHECK(s.num_keys() == before + 2);
    CHECK(s.remove("p"));
    CHECK_FALSE(s.remove("p"));
    CHECK_FALSE(s.check({"p"}));
    CHECK(s.num_keys() == before + 1);
  }
  SUBCASE("append creates and extends") {
    s.append("log", B("ab"));
    s.append("log", B("cd"));
    CHECK(s.get("log", 1s) == B("abcd"));
  }
  SUBCASE("multi_set and multi_get keep order") {
    s.multi_set({"m1", "m2", "m3"}, {B("one"), B(""), B("three")});
    auto v = s.multi_get({"m3", "m1", "m2"}, 1s);
    REQUIRE(v.size() == 3);
    CHECK(v[0] == B("three"));
    CHECK(v[1] == B("one"));
    CHECK(v[2].empty());
  }
  SUBCASE("get of a missing key times out naming the key and the timeout") {
    try {
      s.get("never", 150ms);
      FAIL("get of a missing key returned");
    } catch (const TimeoutError& e) {
      std::string what = e.what();
      CHECK(what.find("'never'") != std::string::npos);
      CHECK(what.find("150 ms") != std::string::npos);
    }
  }
  SUBCASE("wait times out naming its keys") {
    s.set("w1", B("x"));
    CHECK_THROWS_WITH_AS(s.wait({"w1", "w2"}, 100ms), doctest::Contains("'w2'"), TimeoutError);
    CHECK_THROWS_AS(s.multi_get({"w1", "w2"}, 50ms), TimeoutError);
  }
  SUBCASE("a zero timeout answers at once") {
    s.set("now", B("v"));
    CHECK(s.get("now", 0ms) == B("v"));
    CHECK_THROWS_AS(s.get("not-now", 0ms), TimeoutError);
  }
}

}  // namespace

TEST_CASE("store operations over TCP") {
  ServerThread server;
  Client c(server.client_options());
  c.ping();
  exercise(c);
}

TEST_CASE("store operations on the in-memory twin") {
  HashStore h;
  exercise(h);
}

TEST_CASE("the default multi-key operations work on a store without them") {
  // PrefixStore forwards; the defaults in Store are covered through a
  // minimal store that only has the core calls.
  struct Core : Store {
    HashStore h;
    void set(const std::string& k, const Bytes& v) override { h.set(k, v); }
    Bytes get(const std::string& k, Duration t) override { return h.get(k, t); }
    int64_t add(const std::string& k, int64_t d) override { return h.add(k, d); }
    Bytes compare_set(const std::string& k, const Bytes& e, const Bytes& d) override {
      return h.compare_set(k, e, d);
    }
    void wait(const std::vector<std::string>& k, Duration t) override { h.wait(k, t); }
    bool check(const std::vector<std::string>& k) override { return h.check(k); }
    bool remove(const std::string& k) override { return h.remove(k); }
    int64_t num_keys() override { return h.num_keys(); }
  } core;
  core.append("x", B("ab"));
  core.append("x", B("c"));
  CHECK(core.get("x", 1s) == B("abc"));
  core.multi_set({"a", "b"}, {B("1"), B("2")});
  CHECK(core.multi_get({"b", "a"}, 1s) == std::vector<Bytes>{B("2"), B("1")});
}

TEST_CASE("a blocked get is released by another client's set") {
  ServerThread server;
  Client waiter(server.client_options());
  Client writer(server.client_options());
  auto got = std::async(std::launch::async, [&] { return waiter.get("late", 20s); });
  // The get is parked on the server before the set is sent.
  REQUIRE(server.wait_for_state([](ServerThread& s) { return s.waiters() == 1; }));
  writer.set("late", B("hello"));
  CHECK(got.get() == B("hello"));
  CHECK(server.waiters() == 0);
}

TEST_CASE("a wait for several keys is released by the write of the last one") {
  ServerThread server;
  Client waiter(server.client_options());
  Client writer(server.client_options());
  auto done = std::async(std::launch::async, [&] {
    return waiter.multi_get({"k1", "k2", "k3"}, 20s);
  });
  REQUIRE(server.wait_for_state([](ServerThread& s) { return s.waiters() == 1; }));
  writer.set("k1", B("1"));
  writer.add("k3", 3);
  CHECK(done.wait_for(0s) == std::future_status::timeout);  // k2 still missing
  writer.append("k2", B("2"));
  CHECK(done.get() == std::vector<Bytes>{B("1"), B("2"), B("3")});
}

TEST_CASE("a key deleted before the last write keeps the waiter parked") {
  ServerThread server;
  Client waiter(server.client_options());
  Client writer(server.client_options());
  auto done = std::async(std::launch::async, [&] { waiter.wait({"x", "y"}, 20s); });
  REQUIRE(server.wait_for_state([](ServerThread& s) { return s.waiters() == 1; }));
  writer.set("x", B("1"));
  writer.remove("x");
  writer.set("y", B("1"));
  REQUIRE(server.wait_for_state([](ServerThread& s) { return s.waiters() == 1; }));
  CHECK(done.wait_for(0s) == std::future_status::timeout);
  writer.set("x", B("2"));
  done.get();
}

TEST_CASE("one set releases many waiters at once") {
  ServerThread server;
  constexpr int kWaiters = 50;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kWaiters; ++i) clients.push_back(std::make_unique<Client>(server.client_options()));
  std::vector<std::future<Bytes>> gets;
  for (auto& c : clients) {
    gets.push_back(std::async(std::launch::async, [&c] { return c->get("go", 20s); }));
  }
  REQUIRE(server.wait_for_state([](ServerThread& s) { return s.waiters() == kWaiters; }));
  Client(server.client_options()).set("go", B("now"));
  for (auto& g : gets) CHECK(g.get() == B("now"));
}

TEST_CASE("prefix store scopes keys") {
  ServerThread server;
  Client raw(server.client_options());
  PrefixStore a("run1/", std::make_unique<Client>(server.client_options()));
  PrefixStore b("run2/", raw);
  a.set("k", B("A"));
  b.set("k", B("B"));
  CHECK(raw.get("run1/k", 1s) == B("A"));
  CHECK(raw.get("run2/k", 1s) == B("B"));
  CHECK(a.get("k", 1s) == B("A"));
  CHECK(a.multi_get({"k"}, 1s) == std::vector<Bytes>{B("A")});
  CHECK_THROWS_WITH_AS(a.get("missing", 50ms), doctest::Contains("'run1/missing'"), TimeoutError);
}

TEST_CASE("connect_from_env reads the contract variables") {
  ServerThread server;
  unsetenv("DDPRUN_STORE_ADDR");
  CHECK(connect_from_env() == nullptr);
  setenv("DDPRUN_STORE_ADDR", ("127.0.0.1:" + std::to_string(server.port())).c_str(), 1);
  setenv("DDPRUN_STORE_PREFIX", "job/attempt_0/", 1);
  unsetenv("DDPRUN_STORE_TOKEN");
  unsetenv("DDPRUN_RDZV_TOKEN");
  auto s = connect_from_env();
  REQUIRE(s);
  s->set("k", B("v"));
  CHECK(Client(server.client_options()).get("job/attempt_0/k", 1s) == B("v"));
  setenv("DDPRUN_STORE_ADDR", "no-port-here", 1);
  CHECK_THROWS_WITH_AS(connect_from_env(), doctest::Contains("DDPRUN_STORE_ADDR='no-port-here'"),
                       StoreError);
  setenv("DDPRUN_STORE_ADDR", "host:99999", 1);
  CHECK_THROWS_WITH_AS(connect_from_env(), doctest::Contains("port '99999'"), StoreError);
  unsetenv("DDPRUN_STORE_ADDR");
  unsetenv("DDPRUN_STORE_PREFIX");
}

TEST_CASE("hundreds of clients add to one counter") {
  ServerThread server;
  constexpr int kClients = 200;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&] {
      try {
        Client c(server.client_options());
        c.add("ctr", 1);
      } catch (const std::exception&) {
        ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failures == 0);
  CHECK(Client(server.client_options()).get("ctr", 1s) == B(std::to_string(kClients)));
}
