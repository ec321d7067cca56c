// The evidence rule on its inputs (evidence.h, python_stack.h): Python
// dumps as faulthandler and py-spy print them, counters as /proc gives
// them; and the Watchdog asking for a verdict at the learned bound on a
// ManualClock. The rule on real processes: freeze_test.cc.
#include <doctest/doctest.h>

#include <optional>

#include "base/clock.h"
#include "tests/watchdog/test_util.h"
#include "watchdog/evidence.h"
#include "watchdog/hang_report.h"
#include "watchdog/python_stack.h"
#include "watchdog/watchdog.h"

namespace wd = ddprun::watchdog;
using namespace std::chrono_literals;
using ddprun::base::ManualClock;
using wd::testing::beat;

namespace {

const char* kTorch = "/venv/lib/python3.11/site-packages/torch";

// faulthandler's layout: a helper thread first, the main thread (its
// outermost frame a module's top level) after it.
std::string dump(const std::string& innermost) {
  return std::string("Thread 0x00007f00000002 (most recent call first):\n"
                     "  File \"/usr/lib/python3.11/threading.py\", line 320 in wait\n"
                     "  File \"/usr/lib/python3.11/threading.py\", line 1002 in _bootstrap\n"
                     "\n"
                     "Current thread 0x00007f00000001 (most recent call first):\n") +
         innermost + "  File \"/job/train.py\", line 40 in step\n" +
         "  File \"/job/train.py\", line 60 in <module>\n";
}

std::string c10d(const std::string& fn, int line) {
  return std::string("  File \"") + kTorch + "/distributed/distributed_c10d.py\", line " +
         std::to_string(line) + " in " + fn + "\n  File \"" + kTorch +
         "/distributed/c10d_logger.py\", line 81 in wrapper\n";
}

const std::string kSleep = "  File \"/job/train.py\", line 12 in stall\n";
const std::string kBackward = std::string("  File \"") + kTorch +
                              "/autograd/graph.py\", line 768 in _engine_run_backward\n  File \"" +
                              kTorch + "/_tensor.py\", line 626 in backward\n";
const std::string kLoader = std::string("  File \"/usr/lib/python3.11/queue.py\", line 180 in get\n  File \"") +
                            kTorch + "/utils/data/dataloader.py\", line 1133 in _try_get_data\n  File \"" +
                            kTorch + "/utils/data/dataloader.py\", line 1295 in _get_data\n";

wd::RankSample sample(int rank, const std::string& python, uint64_t cpu = 0, uint64_t io = 100) {
  wd::RankSample s;
  s.rank = rank;
  s.pid = 1000 + rank;
  s.state = 'S';
  s.cpu_ticks = cpu;
  s.io_bytes = io;
  s.python = python;
  return s;
}

}  // namespace

TEST_CASE("python stack: the main thread's collective, DDP's backward and a DataLoader wait are read "
          "from faulthandler's and py-spy's layouts") {
  auto w = wd::parse_python_stack(dump(c10d("all_reduce", 2050)));
  REQUIRE(w.found);
  CHECK(w.collective == "all_reduce");
  CHECK(w.call_site == "train.py:40 in step");
  CHECK(w.frames.back().function == "<module>");
  CHECK(wd::parse_python_stack(dump(kBackward)).in_backward);
  CHECK(wd::parse_python_stack(dump(kBackward)).collective == "backward (DDP's gradient all-reduce)");
  CHECK(wd::parse_python_stack(dump(kLoader)).waits_on_children);
  const auto sleeping = wd::parse_python_stack(dump(kSleep));
  CHECK(sleeping.collective.empty());  // the helper thread's wait is not the main thread's
  CHECK(sleeping.call_site == "train.py:12 in stall");
  const auto spy = wd::parse_python_stack("Thread 77 (idle): \"MainThread\"\n"
                                          "    broadcast (torch/distributed/distributed_c10d.py:1900)\n"
                                          "    step (train.py:45)\n"
                                          "    <module> (train.py:60)\n");
  CHECK(spy.collective == "broadcast");
  CHECK(spy.call_site == "train.py:45 in step");
}

TEST_CASE("evidence: a rank asleep outside any collective while the others wait in one is hung, "
          "named the culprit") {
  const std::vector<wd::RankSample> before{sample(0, dump(c10d("all_reduce", 1))), sample(1, dump(kSleep))};
  const auto j = wd::judge(before, before, 25, false);
  CHECK(j.hung);
  CHECK(j.culprits == std::vector<int>{1});
  CHECK(j.state == wd::CulpritState::kAsleep);
  CHECK(j.why.find("train.py:12 in stall") != std::string::npos);
  // The same, burning CPU: spinning.
  std::vector<wd::RankSample> after = before;
  after[1].cpu_ticks += 90;
  CHECK(wd::judge(before, after, 25, false).state == wd::CulpritState::kSpinning);
  CHECK(wd::judge(before, after, 25, false).hung);
}

TEST_CASE("evidence: I/O in a rank's process tree, a stack that moved, a DataLoader wait or every "
          "rank in its own code is alive") {
  const std::vector<wd::RankSample> before{sample(0, dump(c10d("barrier", 1))), sample(1, dump(kSleep))};
  auto io = before;
  io[1].io_bytes = 4196;  // a child wrote
  CHECK_FALSE(wd::judge(before, io, 25, false).hung);
  CHECK(wd::judge(before, io, 25, false).why.find("I/O") != std::string::npos);
  auto moved = before;  // a call made between the samples
  moved[1].between = {dump("  File \"/job/util.py\", line 3 in helper\n" + kSleep)};
  CHECK_FALSE(wd::judge(before, moved, 25, false).hung);
  // Only the innermost line changed (a loop without a call): not movement.
  auto loop = before;
  loop[1].python = dump("  File \"/job/train.py\", line 13 in stall\n");
  CHECK(wd::judge(before, loop, 25, false).hung);
  const std::vector<wd::RankSample> loader{sample(0, dump(c10d("barrier", 1))), sample(1, dump(kLoader))};
  CHECK_FALSE(wd::judge(loader, loader, 25, false).hung);
  const std::vector<wd::RankSample> http{
      sample(0, dump(c10d("barrier", 1))),
      sample(1, dump("  File \"/usr/lib/python3.11/ssl.py\", line 1134 in read\n"
                     "  File \"/usr/lib/python3.11/http/client.py\", line 286 in _read_status\n"))};
  CHECK(wd::judge(http, http, 25, false).why.find("waits on the network") != std::string::npos);
  CHECK_FALSE(wd::judge(http, http, 25, false).hung);
  const std::vector<wd::RankSample> phase{sample(0, dump(kSleep)), sample(1, dump(kSleep))};
  CHECK_FALSE(wd::judge(phase, phase, 25, false).hung);
  auto native = before;
  native[1].python.reset();
  CHECK_FALSE(wd::judge(native, native, 25, false).hung);
  // Every rank in its backward pass and burning CPU: computing.
  const std::vector<wd::RankSample> bw0{sample(0, dump(kBackward), 0), sample(1, dump(kBackward), 0)};
  const std::vector<wd::RankSample> bw1{sample(0, dump(kBackward), 80), sample(1, dump(kBackward), 80)};
  CHECK_FALSE(wd::judge(bw0, bw1, 25, false).hung);
}

TEST_CASE("evidence: ranks in different collectives are a mismatch naming both calls; in the same "
          "one on one node a deadlock, with other nodes no verdict") {
  const std::vector<wd::RankSample> mismatch{sample(0, dump(c10d("all_reduce", 1))),
                                             sample(1, dump(c10d("broadcast", 2)))};
  const auto j = wd::judge(mismatch, mismatch, 25, false);
  CHECK(j.hung);
  CHECK(j.state == wd::CulpritState::kMismatch);
  CHECK(j.why.find("rank 0 in all_reduce") != std::string::npos);
  CHECK(j.why.find("rank 1 in broadcast") != std::string::npos);
  const std::vector<wd::RankSample> same{sample(0, dump(c10d("barrier", 1))), sample(1, dump(c10d("barrier", 1)))};
  CHECK(wd::judge(same, same, 25, false).state == wd::CulpritState::kDeadlock);
  CHECK_FALSE(wd::judge(same, same, 25, true).hung);
  // The report names the mismatch from the stacks alone, and advises no flag.
  wd::HangReport r;
  r.culprit = 0;
  for (const auto& s : mismatch) {
    wd::StackCapture c;
    c.global_rank = s.rank;
    c.pid = s.pid;
    c.method = wd::StackMethod::kPythonFaulthandler;
    c.text = *s.python;
    r.stacks.push_back(c);
  }
  r.find_culprit();
  CHECK(r.in_collective == std::vector<int>{0, 1});
  CHECK(r.mismatch.find("rank 1 in broadcast at train.py:40 in step") != std::string::npos);
  CHECK(r.advice().front().find("different collectives") != std::string::npos);
  CHECK(r.summary().find("--hang-timeout-floor") == std::string::npos);
}

TEST_CASE("evidence: DDP's backward counts as inside a collective for the culprit drawn from the "
          "stacks") {
  wd::HangReport r;
  r.culprit = 0;
  r.workers.resize(2);
  r.workers[0].global_rank = 0;
  r.workers[1].global_rank = 1;
  const std::vector<std::string> texts{dump(kBackward), dump(kSleep)};
  for (int rank = 0; rank < 2; ++rank) {
    wd::StackCapture c;
    c.global_rank = rank;
    c.pid = 1000 + rank;
    c.method = wd::StackMethod::kPythonFaulthandler;
    c.text = texts[rank];
    r.stacks.push_back(c);
  }
  r.find_culprit();
  CHECK(r.in_collective == std::vector<int>{0});
  CHECK(r.culprit == 1);
  CHECK(r.culprit_by_stacks);
  CHECK(r.culprit_frames().find("line 12 in stall") != std::string::npos);
}

TEST_CASE("learned: past the learned bound below the floor the watchdog asks for a verdict; alive "
          "waits for the floor, hung fires at once") {
  wd::LearnerOptions lo;
  lo.floor = 60s;
  wd::TimeoutLearner learner(lo);
  ManualClock clock;
  std::optional<wd::HangEvent> hang;
  wd::WatchdogOptions o;
  o.stuck_timeout = 0ms;
  wd::Watchdog dog(clock, o, [&](const wd::HangEvent& e) { hang = e; }, &learner);
  std::optional<wd::Watchdog::Verdict> pending;
  std::optional<wd::HangEvent> asked;
  dog.set_judge([&](const wd::HangEvent& e, wd::Watchdog::Verdict done) {
    asked = e;
    pending = std::move(done);
  });
  dog.add_worker(0, 0, 4242);
  dog.add_worker(1, 1, 4243);
  for (int s = 0; s < 20; ++s) {
    clock.advance(100ms);
    for (int r : {0, 1}) dog.on_beat(beat(r, s, clock.now(), wd::BeatKind::kAuto));
  }
  CHECK(learner.evidence_bound() == 1s);  // 5 x 100 ms, raised to the 1 s minimum
  clock.advance(999ms);
  CHECK_FALSE(asked);
  clock.advance(2ms);
  REQUIRE(asked);
  CHECK(asked->by_evidence);
  CHECK(dog.judgements() == 1);
  // Alive: nothing fires until the full timeout (the floor), and the same
  // stall is not judged again.
  (*pending)(false, "rank 1 is alive: its Python stack moved");
  pending.reset();
  clock.advance(30s);
  CHECK_FALSE(hang);
  CHECK(dog.judgements() == 1);
  clock.advance(30s);
  REQUIRE(hang);
  CHECK_FALSE(hang->by_evidence);
}

// One rank beating every `every` 20 times under a Watchdog whose judge
// keeps the verdict callback for the test to answer.
struct Judged {
  explicit Judged(wd::Millis every) : dog(clock, options(), [this](const wd::HangEvent& e) { hang = e; }, &learner) {
    dog.set_judge([this](const wd::HangEvent&, wd::Watchdog::Verdict done) { pending = std::move(done); });
    dog.add_worker(0, 0, 4242);
    for (int s = 0; s < 20; ++s) {
      clock.advance(every);
      dog.on_beat(beat(0, s, clock.now(), wd::BeatKind::kAuto));
    }
  }
  static wd::WatchdogOptions options() {
    wd::WatchdogOptions o;
    o.stuck_timeout = 0ms;
    return o;
  }
  wd::TimeoutLearner learner;
  ManualClock clock;
  std::optional<wd::HangEvent> hang;
  std::optional<wd::Watchdog::Verdict> pending;
  wd::Watchdog dog;
};

TEST_CASE("learned: a hung verdict fires at the learned bound, the evidence in the detail") {
  Judged j(400ms);
  j.clock.advance(2001ms);  // 5 x 400 ms
  REQUIRE(j.pending);
  j.clock.advance(1s);  // the window
  (*j.pending)(true, "rank 0 is outside any collective, asleep");
  REQUIRE(j.hang);
  CHECK(j.hang->by_evidence);
  CHECK(j.hang->timeout == 2s);
  CHECK(j.hang->detail.find("past the learned bound of 2.00 s") != std::string::npos);
  CHECK(j.hang->evidence == "rank 0 is outside any collective, asleep");
}

TEST_CASE("learned: a beat while the verdict is pending makes it stale: no fire") {
  Judged j(100ms);
  j.clock.advance(1001ms);
  REQUIRE(j.pending);
  j.dog.on_beat(beat(0, 21, j.clock.now(), wd::BeatKind::kAuto));
  (*j.pending)(true, "stale");
  CHECK_FALSE(j.hang);
}

TEST_CASE("learned: a section past its learned bound below the floor is judged too; setup never") {
  wd::TimeoutLearner learner;
  for (int i = 0; i < 3; ++i) learner.add("checkpoint", 1500ms);
  CHECK(learner.evidence_bound("checkpoint") == 7500ms);  // 5 x 1.5 s, under the 60 s floor
  learner.add("checkpoint", 20s);
  CHECK(learner.evidence_bound("checkpoint") == 0ms);  // 100 s: the floor is sooner
  for (int i = 0; i < 3; ++i) learner.add("setup", 100ms);
  CHECK(learner.evidence_bound("setup") == 0ms);
  CHECK(learner.evidence_bound("eval") == 0ms);  // never seen: its initial timeout
  ManualClock clock;
  std::optional<wd::HangEvent> hang;
  wd::WatchdogOptions o;
  o.stuck_timeout = 0ms;
  wd::TimeoutLearner l2;
  wd::Watchdog dog(clock, o, [&](const wd::HangEvent& e) { hang = e; }, &l2);
  std::optional<wd::HangEvent> asked;
  dog.set_judge([&](const wd::HangEvent& e, wd::Watchdog::Verdict) { asked = e; });
  dog.add_worker(0, 0, 4242);
  dog.on_beat(beat(0, 1, clock.now(), wd::BeatKind::kAuto));
  for (int i = 0; i < 2; ++i) {
    dog.on_beat(beat(0, -1, clock.now(), wd::BeatKind::kSectionStart, "checkpoint"));
    clock.advance(1s);
    dog.on_beat(beat(0, -1, clock.now(), wd::BeatKind::kSectionEnd, "checkpoint"));
  }
  dog.on_beat(beat(0, -1, clock.now(), wd::BeatKind::kSectionStart, "checkpoint"));
  clock.advance(5001ms);
  REQUIRE(asked);
  CHECK(asked->kind == wd::HangKind::kSection);
  CHECK(asked->by_evidence);
  CHECK(asked->timeout == 5s);
}
