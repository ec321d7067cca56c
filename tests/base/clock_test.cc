// The clock seam: ManualClock fires timers in due order at their due time
// (advance) or late (jump), never after cancel, re-arm or destruction; and
// SteadyClock, the production one, keeps the same promises on a real loop.
#include <doctest/doctest.h>

#include <boost/asio/io_context.hpp>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/steady_clock.h"

using namespace ddprun::base;
using namespace std::chrono_literals;

TEST_CASE("a manual clock stands still and fires timers in due order at their due time") {
  ManualClock clock;
  const TimePoint t0 = clock.now();
  auto a = clock.make_timer(), b = clock.make_timer(), c = clock.make_timer();
  std::vector<std::string> log;
  auto record = [&](const char* name) {
    return [&, name] {
      log.push_back(name + std::string("@") + std::to_string((clock.now() - t0) / 1ms));
    };
  };
  a->arm(t0 + 30ms, record("a"));
  b->arm(t0 + 10ms, record("b"));
  c->arm(t0 + 10ms, record("c"));  // same time as b, armed after it
  CHECK(clock.armed_timers() == 3);
  clock.advance(9ms);
  CHECK(log.empty());
  clock.advance(100ms);
  CHECK(log == std::vector<std::string>{"b@10", "c@10", "a@30"});
  CHECK(clock.now() == t0 + 109ms);
  CHECK(clock.armed_timers() == 0);
}

TEST_CASE("a timer armed by another's callback fires within the same advance") {
  ManualClock clock;
  const TimePoint t0 = clock.now();
  auto first = clock.make_timer(), second = clock.make_timer();
  std::vector<TimePoint> fired;
  first->arm(t0 + 10ms, [&] {
    fired.push_back(clock.now());
    second->arm(clock.now() + 5ms, [&] { fired.push_back(clock.now()); });
  });
  clock.advance(1s);
  CHECK(fired == std::vector<TimePoint>{t0 + 10ms, t0 + 15ms});
}

TEST_CASE("jump fires what fell due late, at the new time") {
  ManualClock clock;
  const TimePoint t0 = clock.now();
  auto timer = clock.make_timer();
  TimePoint seen{};
  timer->arm(t0 + 10ms, [&] { seen = clock.now(); });
  clock.jump(5s);
  CHECK(seen == t0 + 5s);
}

TEST_CASE("cancel, re-arm and destruction each stop the pending call") {
  ManualClock clock;
  int calls = 0;
  auto cancelled = clock.make_timer();
  cancelled->arm(clock.now() + 1ms, [&] { ++calls; });
  cancelled->cancel();
  CHECK_FALSE(cancelled->armed());
  auto rearmed = clock.make_timer();
  rearmed->arm(clock.now() + 1ms, [&] { calls += 100; });
  rearmed->arm(clock.now() + 2ms, [&] { calls += 10; });
  {
    auto gone = clock.make_timer();
    gone->arm(clock.now() + 1ms, [&] { calls += 1000; });
  }
  CHECK(clock.advance_to_next());
  CHECK(calls == 10);
  CHECK_FALSE(clock.advance_to_next());
}

TEST_CASE("a callback may destroy its own timer") {
  ManualClock clock;
  auto timer = clock.make_timer();
  bool fired = false;
  timer->arm(clock.now(), [&] {
    fired = true;
    timer.reset();
  });
  clock.advance(0ms);
  CHECK(fired);
  CHECK(clock.armed_timers() == 0);
}

TEST_CASE("the steady clock fires on its loop and never after cancel or re-arm") {
  boost::asio::io_context io;
  SteadyClock clock(io);
  auto timer = clock.make_timer(), cancelled = clock.make_timer();
  int calls = 0;
  cancelled->arm(clock.now(), [&] { calls += 100; });
  cancelled->cancel();
  timer->arm(clock.now(), [&] { calls += 1000; });
  timer->arm(clock.now() + 1ms, [&] { ++calls; });
  CHECK(timer->armed());
  io.run_for(10s);  // returns once no timer is left
  CHECK(calls == 1);
  CHECK_FALSE(timer->armed());
  // Nor after its destruction.
  auto gone = clock.make_timer();
  gone->arm(clock.now(), [&] { calls += 10; });
  gone.reset();
  io.restart();
  io.run_for(10s);
  CHECK(calls == 1);
}
