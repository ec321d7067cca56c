// The keep-alive's silent-death rule (PeerWatch) and beat schedule on a
// ManualClock: a peer is dead exactly one window after its counter last
// changed, not before, whatever the read times; no test waits. The
// keep-alive thread itself runs against a real store in keep_alive_test.cc
// and rendezvous_test.cc.
#include <doctest/doctest.h>

#include "base/clock.h"
#include "rendezvous/peer_watch.h"

using namespace ddprun::rendezvous;
using namespace std::chrono_literals;
using ddprun::base::ManualClock;

namespace {

Bytes counter(int n) { return to_bytes(std::to_string(n)); }

}  // namespace

TEST_CASE("a peer whose counter stops is dead exactly one window after its last change") {
  ManualClock clock;
  PeerWatch watch(2, 3000ms, clock.now());
  int a = 0, b = 0;
  // Both beat every second for ten seconds.
  for (int i = 0; i < 10; ++i) {
    clock.advance(1s);
    CHECK_FALSE(watch.update({counter(++a), counter(++b)}, clock.now()));
  }
  // Peer 1 stops; peer 0 goes on.
  const auto last_change = clock.now();
  clock.advance(1s);
  CHECK_FALSE(watch.update({counter(++a), counter(b)}, clock.now()));
  clock.advance(1999ms);
  CHECK_FALSE(watch.update({counter(++a), counter(b)}, clock.now()));
  CHECK(watch.silent_for(1, clock.now()) == 2999ms);
  clock.advance(1ms);
  auto dead = watch.update({counter(++a), counter(b)}, clock.now());
  REQUIRE(dead);
  CHECK(*dead == 1);
  CHECK(watch.silent_for(1, clock.now()) == 3000ms);
  CHECK(clock.now() - last_change == 3s);
}

TEST_CASE("a peer that never beat counts from the start of the watch") {
  ManualClock clock;
  PeerWatch watch(1, 1500ms, clock.now());
  clock.advance(1499ms);
  CHECK_FALSE(watch.update({Bytes{}}, clock.now()));
  clock.advance(1ms);
  CHECK(watch.update({Bytes{}}, clock.now()) == std::optional<size_t>(0));
}

TEST_CASE("one changed value between sparse reads is enough to stay alive") {
  // The reader may be slow (a store stall inside the window): a peer whose
  // counter moved since the last read is alive, however long ago that was.
  ManualClock clock;
  PeerWatch watch(1, 3000ms, clock.now());
  clock.advance(2900ms);
  CHECK_FALSE(watch.update({counter(1)}, clock.now()));
  clock.advance(2900ms);
  CHECK_FALSE(watch.update({counter(2)}, clock.now()));
  clock.advance(3000ms);
  CHECK(watch.update({counter(2)}, clock.now()));
}

TEST_CASE("the first of several silent peers is reported") {
  ManualClock clock;
  PeerWatch watch(3, 1000ms, clock.now());
  clock.advance(1s);
  CHECK(watch.update({counter(1), Bytes{}, Bytes{}}, clock.now()) == std::optional<size_t>(1));
}

TEST_CASE("beats are due one interval after the last, so a slow round trip never bunches them") {
  ManualClock clock;
  BeatSchedule beats(5000ms, clock.now());
  CHECK(beats.due(clock.now()));  // the first at once
  beats.beaten(clock.now());
  clock.advance(4999ms);
  CHECK_FALSE(beats.due(clock.now()));
  clock.advance(2s);  // the store was slow: the beat goes late...
  CHECK(beats.due(clock.now()));
  beats.beaten(clock.now());
  CHECK(beats.next() == clock.now() + 5s);  // ...and the next counts from it
}
