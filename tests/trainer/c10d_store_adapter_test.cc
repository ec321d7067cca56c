#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <thread>

#include <ATen/ATen.h>

#include "rendezvous/hash_store.h"
#include "trainer/c10d_store_adapter.h"
#include "trainer/gloo_communicator.h"

using namespace ddprun;
using namespace std::chrono_literals;
using trainer::C10dStoreAdapter;

namespace {

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

}  // namespace

TEST_CASE("adapter forwards every c10d store call to our store") {
  auto ours = std::make_shared<rendezvous::HashStore>();
  C10dStoreAdapter store(ours, 2s);
  store.set("a", bytes("1"));
  CHECK(store.get("a") == bytes("1"));
  CHECK(ours->get("a", 0ms) == bytes("1"));
  CHECK(store.add("n", 5) == 5);
  CHECK(store.add("n", -2) == 3);
  CHECK(store.check({"a", "n"}));
  CHECK_FALSE(store.check({"a", "missing"}));
  CHECK(store.compareSet("c", {}, bytes("x")) == bytes("x"));
  CHECK(store.compareSet("c", bytes("y"), bytes("z")) == bytes("x"));
  CHECK(store.getNumKeys() == 3);
  CHECK(store.deleteKey("c"));
  CHECK_FALSE(store.deleteKey("c"));
  CHECK(store.getNumKeys() == 2);
  store.wait({"a"}, 10ms);
}

TEST_CASE("adapter maps the store timeout onto get and wait") {
  auto ours = std::make_shared<rendezvous::HashStore>();
  C10dStoreAdapter store(ours, 50ms);
  CHECK_THROWS_AS(store.get("never"), rendezvous::TimeoutError);
  CHECK_THROWS_AS(store.wait({"never"}), rendezvous::TimeoutError);
  CHECK_THROWS_AS(store.wait({"never"}, std::chrono::milliseconds(20)), rendezvous::TimeoutError);
  // A key set by another client wakes a waiter before its deadline.
  std::thread setter([&] { C10dStoreAdapter(ours, 1s).set("late", bytes("v")); });
  store.wait({"late"}, std::chrono::milliseconds(5000));
  setter.join();
}

TEST_CASE("two Gloo ranks meet through the adapter and all-reduce") {
  auto ours = std::make_shared<rendezvous::HashStore>();
  std::vector<at::Tensor> results(2);
  std::vector<std::string> errors(2);
  auto rank_main = [&](int rank) {
    try {
      auto store = c10::make_intrusive<C10dStoreAdapter>(ours, 30s);
      trainer::GlooOptions o;
      o.rank = rank;
      o.world_size = 2;
      o.timeout = 30s;
      trainer::GlooCommunicator comm(store, o);
      at::Tensor t = at::full({1000}, float(rank + 1));
      comm.allreduce(t);
      at::Tensor b = at::full({3}, float(rank * 10));
      comm.broadcast(b, 1);
      comm.barrier();
      results[rank] = at::cat({t, b});
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  };
  std::thread r0(rank_main, 0), r1(rank_main, 1);
  r0.join();
  r1.join();
  REQUIRE(errors[0] == "");
  REQUIRE(errors[1] == "");
  for (const at::Tensor& r : results) {
    CHECK(r.narrow(0, 0, 1000).eq(3.0f).all().item<bool>());
    CHECK(r.narrow(0, 1000, 3).eq(10.0f).all().item<bool>());
  }
}
