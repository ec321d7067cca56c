// base/service_thread.h with real threads and a real blocking call (read()
// on a pipe nobody writes, as a store call to a host that is gone): a hand
// over wakes the body long before its poll deadline, the body's own
// deadline wakes it with nothing handed over, and stop() ends a body
// blocked in a call through `interrupt` and joins it. Waits are polls with
// a deadline on what the body shows.
#include <doctest/doctest.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "base/scoped_fd.h"
#include "base/service_thread.h"

using ddprun::base::ServiceThread;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

template <class Pred>
bool eventually(Pred pred) {
  const auto deadline = Clock::now() + 30s;
  while (!pred() && Clock::now() < deadline) std::this_thread::yield();
  return pred();
}

}  // namespace

TEST_CASE("service thread: a hand-over wakes the body before its poll; stop ends its loop") {
  ServiceThread service;
  std::vector<int> inbox;  // guarded by the service's mutex
  std::atomic<int> seen{0}, polls{0};
  std::atomic<bool> ended{false};
  service.start([&] {
    for (;;) {
      std::vector<int> got;
      // An hour's poll: only a hand-over or stop() can wake it in this test.
      if (!service.wait_until(Clock::now() + 1h, [&] { return !inbox.empty(); },
                              [&] { got.swap(inbox); }))
        break;
      if (got.empty()) ++polls;
      seen += static_cast<int>(got.size());
    }
    ended = true;
  });
  service.hand_over([&] { inbox.push_back(1); });
  REQUIRE(eventually([&] { return seen.load() == 1; }));
  service.hand_over([&] { inbox.push_back(2); inbox.push_back(3); });
  REQUIRE(eventually([&] { return seen.load() == 3; }));
  CHECK(polls.load() == 0);
  service.stop();
  CHECK(ended.load());
  service.stop();  // idempotent
}

TEST_CASE("service thread: the body's deadline wakes it with nothing handed over") {
  ServiceThread service;
  std::atomic<int> polls{0};
  service.start([&] {
    while (service.wait_until(Clock::now() + 1ms, [] { return false; }, [] {})) ++polls;
  });
  CHECK(eventually([&] { return polls.load() >= 3; }));
}

TEST_CASE("service thread: stop() interrupts a blocked call and joins; nothing runs after") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  ddprun::base::ScopedFd read_end(fds[0]), write_end(fds[1]);
  ServiceThread service;
  std::atomic<bool> blocked{false}, returned{false}, woke_after_stop{false};
  service.start(
      [&] {
        blocked = true;
        // Blocks until the interrupt closes the write end (EOF).
        pollfd p{read_end.get(), POLLIN, 0};
        (void)::poll(&p, 1, -1);
        returned = true;
        if (service.wait_until(Clock::now() + 1h, [] { return true; }, [] {}))
          woke_after_stop = true;
      },
      [&] { write_end.reset(); });
  REQUIRE(eventually([&] { return blocked.load(); }));
  service.stop();
  CHECK(returned.load());
  CHECK_FALSE(woke_after_stop.load());
}

TEST_CASE("service thread: a service never started stops at once") {
  ServiceThread service;
  service.stop();
}
