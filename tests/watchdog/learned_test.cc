// Learned freeze detection on a ManualClock: TimeoutLearner's arithmetic,
// and the Watchdog judging progress, sections and setup across the node's
// ranks with it. No test waits; beats are fed in as the HeartbeatServer
// would hand them on (heartbeat_test.cc carries real datagrams).
#include <doctest/doctest.h>

#include <optional>

#include "base/clock.h"
#include "tests/watchdog/test_util.h"
#include "watchdog/hang_report.h"
#include "watchdog/timeout_learner.h"
#include "watchdog/watchdog.h"

namespace wd = ddprun::watchdog;
using namespace std::chrono_literals;
using ddprun::base::ManualClock;
using wd::BeatKind;
using wd::testing::beat;

namespace {

constexpr pid_t kPid = 4242;  // never read: the stuck detector is off

wd::LearnerOptions small_floor() {
  wd::LearnerOptions o;
  o.floor = 1s;
  return o;
}

wd::WatchdogOptions no_fixed() {
  wd::WatchdogOptions o;
  o.stuck_timeout = 0ms;
  return o;
}

struct Learned {
  explicit Learned(wd::TimeoutLearner& learner)
      : dog(clock, no_fixed(), [this](const wd::HangEvent& e) { hang = e; }, &learner) {
    dog.on_unwatched([this](const std::vector<int>& ranks, wd::Millis) { unwatched = ranks; });
  }
  ManualClock clock;
  std::optional<wd::HangEvent> hang;
  std::vector<int> unwatched;
  wd::Watchdog dog;

  // Every rank in `ranks` beats (automatic, optimizer.step()) `n` times,
  // `every` apart, from step `from`.
  void steps(std::vector<int> ranks, int from, int n, wd::Millis every) {
    for (int s = from; s < from + n; ++s) {
      clock.advance(every);
      for (int r : ranks) dog.on_beat(beat(r, s, clock.now(), BeatKind::kAuto));
    }
  }
};

}  // namespace

TEST_CASE("a kind's timeout is the initial one until enough samples, then max(floor, 5 x max)") {
  wd::TimeoutLearner l(small_floor());
  CHECK(l.timeout("step") == 600s);
  for (int i = 0; i < 9; ++i) l.add("step", 100ms);
  CHECK(l.timeout("step") == 600s);  // 9 < 10 samples: still the initial guess
  l.add("step", 300ms);
  CHECK(l.timeout("step") == 1500ms);  // 5 x the longest, above the 1 s floor
  l.add("step", 10ms);
  CHECK(l.timeout("step") == 1500ms);  // a short one never narrows it
  const auto t = l.explain("step");
  CHECK(t.learned);
  CHECK(t.samples == 11);
  CHECK(t.max == 300ms);
  CHECK(t.describe() == "step: 1.5 s, from 11 gaps between beats, p99 0.3 s, max 0.3 s");
  wd::TimeoutLearner tiny(small_floor());
  for (int i = 0; i < 20; ++i) tiny.add("step", 1ms);
  CHECK(tiny.timeout("step") == 1s);  // 1 ms steps: the floor, not 5 ms
  CHECK(tiny.timeout("checkpoint") == 600s);
  CHECK(tiny.explain("checkpoint").describe() == "checkpoint: 600 s (initial; 0 sections so far)");
}

TEST_CASE("learned: a rank that stops progressing is caught 5 x the longest step after the node's "
          "last progress, and named culprit") {
  wd::TimeoutLearner learner(small_floor());
  Learned w(learner);
  w.dog.add_worker(0, 0, kPid);
  w.dog.add_worker(1, 1, kPid + 1);
  w.steps({0, 1}, 1, 49, 400ms);
  // Rank 0 goes on into the next step's forward pass; rank 1 stops.
  w.clock.advance(400ms);
  w.dog.on_beat(beat(0, 50, w.clock.now(), BeatKind::kAuto));
  w.clock.advance(100ms);
  w.dog.on_beat(beat(0, -1, w.clock.now(), BeatKind::kForward));
  const auto rank0_last = w.clock.now();
  w.clock.advance(1999ms);  // rank 0 waits for rank 1 in the all-reduce
  CHECK_FALSE(w.hang);
  w.clock.advance(1ms);  // 5 x 0.4 s after the last progress on the node
  REQUIRE(w.hang);
  CHECK(w.hang->global_rank == 1);  // the oldest progress names the event
  CHECK(w.hang->kind == wd::HangKind::kHeartbeat);
  CHECK(w.hang->due == rank0_last + 2s);
  CHECK(w.hang->learned_from.find("step: 2 s, from") == 0);
  CHECK(w.dog.culprit(*w.hang) == 1);  // behind in steps, and the oldest beat
  const auto report = wd::make_hang_report(w.dog, *w.hang, 0);
  CHECK(report.culprit == 1);
  CHECK(report.suspects.front() == 1);
  CHECK(report.summary().rfind("Hang detected in attempt 0: rank 1 ", 0) == 0);
}

TEST_CASE("learned: peers waiting while rank 0 is inside a checkpoint section are not hung") {
  wd::TimeoutLearner learner(small_floor());
  Learned w(learner);
  w.dog.add_worker(0, 0, kPid);
  w.dog.add_worker(1, 1, kPid + 1);
  w.steps({0, 1}, 1, 20, 100ms);
  CHECK(learner.timeout("step") == 1s);
  for (int round = 0; round < 3; ++round) {
    w.dog.on_beat(beat(0, -1, w.clock.now(), BeatKind::kSectionStart, "checkpoint"));
    w.clock.advance(3s);  // 30 steps long; rank 1 waits in the next all-reduce
    CHECK_FALSE(w.hang);
    w.dog.on_beat(beat(0, -1, w.clock.now(), BeatKind::kSectionEnd, "checkpoint"));
    w.steps({0, 1}, 21 + 10 * round, 10, 100ms);
  }
  CHECK_FALSE(w.hang);
  CHECK(learner.timeout("checkpoint") == 15s);  // learned from 3 sections: 5 x 3 s
  CHECK(learner.timeout("step") == 1s);          // the waits were not taken for steps
  // A checkpoint that overruns its learned timeout is rank 0's hang.
  w.dog.on_beat(beat(0, -1, w.clock.now(), BeatKind::kSectionStart, "checkpoint"));
  w.clock.advance(15s);
  REQUIRE(w.hang);
  CHECK(w.hang->kind == wd::HangKind::kSection);
  CHECK(w.hang->global_rank == 0);
  CHECK(w.hang->section == "checkpoint");
  CHECK(w.dog.culprit(*w.hang) == 0);
}

TEST_CASE("learned: a rank waiting for another node's rank inside a section is not hung, for as "
          "long as that section's own timeout there") {
  wd::TimeoutLearner learner(small_floor());
  Learned w(learner);
  w.dog.add_worker(0, 1, kPid);  // global rank 1 alone on this node
  // What this node tells the others: at once, then each change.
  std::vector<std::vector<wd::Guard>> told;
  w.dog.on_guards_changed([&](const std::vector<wd::Guard>& g) { told.push_back(g); });
  REQUIRE(told.size() == 1);  // in setup: the other nodes wait for it too
  REQUIRE(told[0].size() == 1);
  CHECK(told[0][0].section == "setup");
  CHECK(told[0][0].until == w.clock.now() + 600s);
  w.steps({1}, 1, 20, 100ms);
  REQUIRE(told.size() == 2);
  CHECK(told[1].empty());  // its first beat ended its setup
  CHECK(learner.timeout("step") == 1s);
  // Node 0's rank 0 starts a checkpoint; its watchdog gives it 10 s.
  w.dog.on_peer_guards(0, {wd::Guard{-1, 0, "checkpoint", w.clock.now() + 10s}});
  REQUIRE(w.dog.peer_guards().size() == 1);
  CHECK(w.dog.peer_guards()[0].node == 0);
  w.clock.advance(6s);  // 6 x the step timeout without a beat here
  CHECK_FALSE(w.hang);
  w.dog.on_peer_guards(0, {});  // the checkpoint ended: a full step timeout from now
  w.clock.advance(999ms);
  CHECK_FALSE(w.hang);
  w.dog.on_beat(beat(1, 21, w.clock.now(), BeatKind::kAuto));  // the all-reduce returned
  w.steps({1}, 22, 10, 100ms);
  CHECK(learner.timeout("step") == 1s);  // the wait was not taken for a step
  // A node that stops telling (its agent died mid-checkpoint) protects no
  // longer than the bound it gave: then the step timeout runs again.
  w.dog.on_peer_guards(0, {wd::Guard{-1, 0, "checkpoint", w.clock.now() + 4s}});
  w.clock.advance(4s);
  CHECK_FALSE(w.hang);
  CHECK(w.dog.peer_guards().empty());
  w.clock.advance(999ms);
  CHECK_FALSE(w.hang);
  w.clock.advance(1ms);
  REQUIRE(w.hang);
  CHECK(w.hang->kind == wd::HangKind::kHeartbeat);
  CHECK(w.hang->global_rank == 1);
  // A section here is told with its own bound (the initial 600 s: unlearned).
  wd::TimeoutLearner learner2(small_floor());
  Learned v(learner2);
  std::vector<wd::Guard> last;
  v.dog.on_guards_changed([&](const std::vector<wd::Guard>& g) { last = g; });
  v.dog.add_worker(0, 0, kPid);
  v.steps({0}, 1, 5, 100ms);
  v.dog.on_beat(beat(0, -1, v.clock.now(), BeatKind::kSectionStart, "checkpoint"));
  REQUIRE(last.size() == 1);
  CHECK(last[0].rank == 0);
  CHECK(last[0].section == "checkpoint");
  CHECK(last[0].until == v.clock.now() + 600s);
  v.clock.advance(2s);
  v.dog.on_beat(beat(0, -1, v.clock.now(), BeatKind::kSectionEnd, "checkpoint"));
  CHECK(last.empty());
}

TEST_CASE("learned: a rank waiting for a peer that still progresses is not hung") {
  wd::TimeoutLearner learner(small_floor());
  Learned w(learner);
  w.dog.add_worker(0, 0, kPid);
  w.dog.add_worker(1, 1, kPid + 1);
  w.steps({0, 1}, 1, 20, 100ms);
  // Rank 0 runs a 5 s evaluation (forward passes); rank 1 finished its own
  // and waits in the next step's all-reduce for rank 0.
  for (int i = 0; i < 50; ++i) {
    w.clock.advance(100ms);
    w.dog.on_beat(beat(0, -1, w.clock.now(), BeatKind::kForward));
  }
  CHECK_FALSE(w.hang);
}

TEST_CASE("learned: forward passes are progress, and an eval pass widens the step timeout") {
  wd::TimeoutLearner learner(small_floor());
  Learned w(learner);
  w.dog.add_worker(0, 0, kPid);
  w.steps({0}, 1, 20, 100ms);
  for (int i = 0; i < 40; ++i) {  // a 4 s evaluation: forward passes only
    w.clock.advance(100ms);
    w.dog.on_beat(beat(0, -1, w.clock.now(), BeatKind::kForward));
  }
  CHECK_FALSE(w.hang);
  CHECK(learner.timeout("step") == 1s);
  // One generation pass without a forward hook firing for 0.9 s: widens.
  w.clock.advance(900ms);
  w.dog.on_beat(beat(0, 21, w.clock.now(), BeatKind::kAuto));
  CHECK(learner.timeout("step") == 4500ms);
  w.clock.advance(4400ms);
  CHECK_FALSE(w.hang);
  w.clock.advance(100ms);
  CHECK(w.hang);
}

TEST_CASE("learned: a setup much longer than the floor is no hang; a rank that never beats is "
          "announced once and never killed") {
  wd::TimeoutLearner learner(small_floor());
  Learned w(learner);
  w.dog.add_worker(0, 0, kPid);
  w.dog.add_worker(1, 1, kPid + 1);
  w.clock.advance(20s);  // imports and data loading: 20 x the floor
  CHECK_FALSE(w.hang);
  w.dog.on_beat(beat(0, 1, w.clock.now(), BeatKind::kAuto));
  // Rank 1 is still in setup: rank 0, waiting for it in a collective, is not hung.
  w.clock.advance(100s);
  CHECK_FALSE(w.hang);
  CHECK(w.unwatched.empty());
  w.clock.advance(480s);  // 600 s after spawn: rank 1's setup ends without a beat
  CHECK(w.unwatched == std::vector<int>{1});
  CHECK_FALSE(w.hang);
  // Rank 0 now is judged again (initial step timeout: too few samples).
  w.clock.advance(600s);
  REQUIRE(w.hang);
  CHECK(w.hang->global_rank == 0);
  CHECK(w.dog.culprit(*w.hang) == 1);  // the live rank that never beat held it up
  CHECK(learner.explain("setup").samples == 1);
}

TEST_CASE("learned: a restarted attempt judges its first step by what earlier attempts learned") {
  wd::TimeoutLearner learner(small_floor());
  {
    Learned first(learner);
    first.dog.add_worker(0, 0, kPid);
    first.steps({0}, 1, 30, 200ms);
  }
  REQUIRE(learner.timeout("step") == 1s);
  Learned second(learner);
  second.dog.add_worker(0, 0, kPid);
  second.clock.advance(5s);
  second.dog.on_beat(beat(0, 1, second.clock.now(), BeatKind::kAuto));
  second.clock.advance(999ms);
  CHECK_FALSE(second.hang);
  second.clock.advance(1ms);
  CHECK(second.hang);  // 1 s after its first step, not the 600 s initial guess
}

TEST_CASE("after a hang that was only reported, the watchdog watches again from the next beat") {
  wd::TimeoutLearner learner(small_floor());
  Learned w(learner);
  w.dog.add_worker(0, 0, kPid);
  w.steps({0}, 1, 20, 100ms);
  w.clock.advance(1s);
  REQUIRE(w.hang);
  w.hang.reset();
  w.dog.rearm_after_report();
  w.clock.advance(60s);
  CHECK_FALSE(w.hang);  // the same stall is not reported again
  w.dog.on_beat(beat(0, 21, w.clock.now(), BeatKind::kAuto));
  w.clock.advance(1s);
  CHECK(w.hang);
}

TEST_CASE("learned: a rank replaced after its hang (--restart-scope=rank) is watched afresh, and "
          "the learned timeout is kept") {
  wd::TimeoutLearner learner(small_floor());
  Learned w(learner);
  w.dog.add_worker(0, 0, kPid);
  w.dog.add_worker(1, 1, kPid + 1);
  w.steps({0, 1}, 1, 49, 400ms);
  w.steps({0}, 50, 1, 400ms);  // rank 1 stops after step 49
  w.clock.advance(2s);
  REQUIRE(w.hang);
  CHECK(w.dog.culprit(*w.hang) == 1);
  const auto timeout = learner.timeout(wd::TimeoutLearner::kStep);
  CHECK(timeout == 2s);
  w.hang.reset();
  w.dog.replace_worker(1, kPid + 10);
  CHECK_FALSE(w.dog.fired());
  const auto& fresh = w.dog.workers().at(1);
  CHECK(fresh.pid == kPid + 10);
  CHECK(fresh.beats == 0);
  CHECK(fresh.step == -1);
  CHECK(fresh.global_rank == 1);
  CHECK(fresh.spawned == w.clock.now());
  // The replacement's setup (start-up, the state from a survivor) holds
  // rank 0 up, not a hang, far past a step's timeout.
  w.clock.advance(10s);
  CHECK_FALSE(w.hang);
  // Both step on; the 10 s across the recovery is no step to learn from.
  w.steps({0, 1}, 50, 5, 400ms);
  CHECK(learner.timeout(wd::TimeoutLearner::kStep) == timeout);
  // The replacement hangs too: caught one learned timeout later, blamed.
  w.steps({0}, 55, 1, 400ms);
  const auto last = w.clock.now();
  w.clock.advance(2s - 1ms);
  CHECK_FALSE(w.hang);
  w.clock.advance(1ms);
  REQUIRE(w.hang);
  CHECK(w.hang->due == last + 2s);
  CHECK(w.hang->pid == kPid + 10);
  CHECK(w.dog.culprit(*w.hang) == 1);
}

TEST_CASE("learned: same step everywhere (train --hang-at-step): the last beat names the culprit, "
          "so the waiting ranks' forward beat on entering the next collective is what makes it right") {
  for (const bool forward : {false, true}) {
    CAPTURE(forward);
    wd::TimeoutLearner learner(small_floor());
    Learned w(learner);
    w.dog.add_worker(0, 0, kPid);
    w.dog.add_worker(1, 1, kPid + 1);
    w.steps({0, 1}, 1, 49, 400ms);
    // Step 50 ends on both ranks at once (its all-reduce); rank 0's beat
    // happens to go out first, then rank 1 stops for good after its own.
    w.clock.advance(400ms);
    w.dog.on_beat(beat(0, 50, w.clock.now(), BeatKind::kAuto));
    w.clock.advance(1ms);
    w.dog.on_beat(beat(1, 50, w.clock.now(), BeatKind::kAuto));
    if (forward) {  // rank 0 enters step 51's all-reduce, where it waits
      w.clock.advance(5ms);
      w.dog.on_beat(beat(0, -1, w.clock.now(), BeatKind::kForward));
    }
    w.clock.advance(3s);  // past 5 x the longest step (now 0.401 s)
    REQUIRE(w.hang);
    // Without the forward beat the one that stopped is indistinguishable
    // (its beat was the later one): rank 0 is blamed. With it, rank 1.
    CHECK(w.dog.culprit(*w.hang) == (forward ? 1 : 0));
  }
}

TEST_CASE("the learner's timeout per beat costs no quantile, and section names past the cap "
          "fold into one kind") {
  wd::TimeoutLearner learner;
  for (int i = 0; i < 5000; ++i) learner.add(wd::TimeoutLearner::kStep, std::chrono::milliseconds(1 + i % 7));
  // The agent asks once per beat of every rank: no work proportional to the
  // 4,096 samples kept (a count, not a time).
  for (int i = 0; i < 10000; ++i) CHECK(learner.timeout(wd::TimeoutLearner::kStep) == 60s);
  CHECK(learner.quantiles_computed() == 0);
  const auto shown = learner.explain(wd::TimeoutLearner::kStep);
  CHECK(learner.quantiles_computed() == 1);
  CHECK(shown.p99 == 7ms);
  CHECK(shown.max == 7ms);
  // Names come from workers: 29 of their own, then one line's worth of fold.
  int folds = 0;
  for (int i = 0; i < 100; ++i) {
    folds += learner.add("section " + std::to_string(i), std::chrono::seconds(20)) ? 1 : 0;
    folds += learner.add("section " + std::to_string(i), std::chrono::seconds(20)) ? 1 : 0;
  }
  CHECK(folds == 1);
  const auto kinds = learner.all();
  CHECK(kinds.size() == wd::TimeoutLearner::kMaxKinds);
  // A folded name's timeout is the shared kind's: learned, 5 x 20 s.
  CHECK(learner.timeout("section 99") == 100s);
  CHECK(learner.explain(wd::TimeoutLearner::kOther).samples == 2 * (100 - wd::TimeoutLearner::kMaxNamedKinds));
  CHECK(learner.timeout("section 3") == 100s);
}
