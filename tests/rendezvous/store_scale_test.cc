// The store at the scale it claims (wire.h): an all-gather of 1,024 ranks
// through multi_get, every rank a client of its own, against a real
// ddprun-store with its default limits.
#include <doctest/doctest.h>

#include <atomic>
#include <thread>

#include "base/fd_limit.h"
#include "rendezvous/client.h"
#include "tests/common/skip.h"
#include "tests/rendezvous/store_process.h"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::testing;

TEST_CASE("an all-gather of 1,024 ranks through multi_get fits the default buffer limit") {
  constexpr size_t kRanks = 1024;
  // Each rank's connection here and its twin in the store, plus slack.
  if (ddprun::base::raise_fd_limit().soft < kRanks + 256) {
    SKIP_TEST("the descriptor limit is below " + std::to_string(kRanks + 256));
  }
  StoreProcess store(STORE_BIN, {}, {"DDPRUN_RDZV_TOKEN", "DDPRUN_STORE_TOKEN"});
  auto port = store.port();
  REQUIRE(port);
  ClientOptions co;
  co.host = "127.0.0.1";
  co.port = *port;
  co.connect_timeout = std::chrono::seconds(60);
  co.op_timeout = std::chrono::seconds(60);
  std::vector<std::string> keys;
  for (size_t r = 0; r < kRanks; ++r) keys.push_back("allgather/" + std::to_string(r));
  // 64 bytes a rank (an address and a few fields): a 70 KB answer each,
  // 70 MB of answers in all, twice the buffer limit.
  auto value_of = [](size_t r) {
    std::string v = "rank " + std::to_string(r) + " at 10.0.0.1:29500 ";
    v.resize(64, '.');
    return wire::Bytes(v.begin(), v.end());
  };
  std::atomic<size_t> ok{0};
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> ranks;
  for (size_t r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      try {
        Client c(co);
        c.set(keys[r], value_of(r));
        auto values = c.multi_get(keys, std::chrono::seconds(120));
        for (size_t i = 0; i < kRanks; ++i) {
          if (values.at(i) != value_of(i)) throw std::runtime_error("wrong value of rank " + std::to_string(i));
        }
        ++ok;
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  std::string first_error;
  for (const auto& e : errors) {
    if (!e.empty()) first_error = e;
  }
  INFO("a failed rank: " << first_error);
  INFO("store log: " << store.log().substr(0, 2000));
  CHECK(ok == kRanks);
  CHECK(store.log().find("closing") == std::string::npos);  // nobody over the limit
  CHECK(store.stop() == 0);
}
