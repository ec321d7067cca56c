// WatchdogHook's side of the evidence rule (evidence.h), and the line that
// says at the first beat how detection works: the samples of every live
// rank run on a thread of their own (a Python dump waits for the
// worker's signal handler, and the window between the samples is a second
// or more), and the verdict is posted back to the loop.
#include <boost/asio/post.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

#include <unistd.h>

#include "watchdog/agent_hook.h"
#include "watchdog/live_stack.h"
#include "watchdog/python_stack.h"

namespace ddprun::watchdog {

namespace {

// Long enough to see a stack move and a loader's read, short against the
// bound it follows.
Millis evidence_window(Millis bound) {
  return std::clamp(Millis(bound.count() / 5), Millis(1000), Millis(3000));
}

constexpr Millis kDumpTimeout{2000};
constexpr Millis kSpinWindow{5000};
// A loop of bytecode answers within milliseconds; a native call holds the
// answer until it returns.
constexpr Millis kProbeTimeout{500};

// Whether every spinning culprit runs a Python loop: its main thread answers
// the bytecode probe (live_stack.h) in the frame its stack is stuck in (the
// line may differ: a loop spans its lines). A long native call or a garbage
// collection cannot answer in time, and a finalizer run by a collection
// answers in its own frame, so only those are left to the spin window. The
// answers' bytes are the agent's, not the rank's.
bool runs_python_loop(const Judgement& j, std::vector<RankSample>& after) {
  if (j.culprits.empty()) return false;
  for (const int rank : j.culprits) {
    auto s = std::find_if(after.begin(), after.end(), [&](const RankSample& r) { return r.rank == rank; });
    if (s == after.end() || !s->python) return false;
    const PythonWhere where = parse_python_stack(*s->python);
    if (!where.found || where.frames.empty()) return false;
    const BytecodeProbe probe = probe_bytecode(s->pid, kProbeTimeout);
    s->dump_bytes += probe.bytes;
    if (!probe.answered || probe.function != where.frames.front().function ||
        probe.file != where.frames.front().file)
      return false;
  }
  return true;
}

}  // namespace

void WatchdogHook::say_detection_on(int rank) {
  // After the first beat, not at start: the program's own first lines come
  // first, and a job that never beats is told so instead (arm_native_notice).
  if (!options_.learn || options_.detect.heartbeat_timeout.count() > 0) return;
  const auto& l = options_.learner;
  if (!options_.is_python) {
    // No Python stacks to judge a stall by: the floor sets the timeouts.
    spdlog::info("freeze detection is on (rank {} beat): timeouts learned from the job's rhythm, "
                 "{:g} x the longest gap between beats and at least the {:g} s floor "
                 "(--hang-timeout-floor; {:g} s until {} gaps are seen; --hang-timeout=0 turns it off)",
                 rank, l.factor, l.floor.count() / 1000.0, l.initial_step.count() / 1000.0,
                 l.min_step_samples);
    return;
  }
  spdlog::info("freeze detection is on (rank {} beat): a stall is judged from what the ranks are "
               "doing once it outlasts {:g} x the longest gap between beats (at least {:g} s; {:g} s "
               "until {} gaps are seen), ended then when hung, else at the {:g} s floor "
               "(--hang-timeout-floor; --hang-timeout=0 turns detection off)",
               rank, l.factor, l.min_evidence_bound.count() / 1000.0, l.initial_step.count() / 1000.0,
               l.min_step_samples, l.floor.count() / 1000.0);
}

void WatchdogHook::judge_stall(const HangEvent& event, Watchdog::Verdict done) {
  std::vector<std::pair<int, pid_t>> ranks;
  for (const auto& w : dog_->workers())
    if (!w.exited) ranks.emplace_back(w.global_rank, w.pid);
  const Millis window = evidence_window(event.timeout);
  // A rank is busy when it ran a quarter of the window.
  const uint64_t busy_ticks = std::max<uint64_t>(
      1, static_cast<uint64_t>(std::max(1L, ::sysconf(_SC_CLK_TCK)) * window.count() / 4000));
  const bool other_nodes = info_.round.group_world_size > 1;
  const bool dumps = options_.live_stacks;
  // A sampling still running is an earlier attempt's: never waited for on
  // the loop (a dump may take seconds), left to end on its own.
  if (evidence_.active()) {
    evidence_.cancel();
    if (!evidence_.join_until(std::chrono::steady_clock::now())) evidence_.abandon();
  }
  auto result = std::make_shared<std::pair<Judgement, std::vector<RankSample>>>();
  const Watchdog* dog = dog_.get();
  evidence_.start(
      [ranks, window, busy_ticks, other_nodes, dumps, result](const base::OffLoopTask::Token& token) {
        std::vector<RankSample> before, after;
        for (const auto& [rank, pid] : ranks) {
          if (token.cancelled()) return;
          before.push_back(sample_rank(rank, pid, dumps, kDumpTimeout));
        }
        // Two more dumps inside the window: two alone can catch a busy
        // loop's rank at the same line twice.
        std::vector<std::vector<std::string>> between(ranks.size());
        std::vector<uint64_t> dump_bytes(ranks.size(), 0);
        const auto start = std::chrono::steady_clock::now();
        for (int third = 1; third <= 3; ++third) {
          const auto until = start + window * third / 3;
          while (std::chrono::steady_clock::now() < until && !token.cancelled())
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          if (third == 3 || !dumps) continue;
          for (std::size_t i = 0; i < ranks.size() && !token.cancelled(); ++i) {
            auto d = dump_python_stack(ranks[i].second, kDumpTimeout);
            if (d.ok) {
              dump_bytes[i] += d.text.size();
              between[i].push_back(std::move(d.text));
            }
          }
        }
        if (token.cancelled()) return;
        for (std::size_t i = 0; i < ranks.size(); ++i) {
          after.push_back(sample_rank_counters_first(ranks[i].first, ranks[i].second, dumps, kDumpTimeout));
          after.back().between = std::move(between[i]);
          after.back().dump_bytes = dump_bytes[i];
        }
        Judgement j = judge(before, after, busy_ticks, other_nodes);
        // A busy rank whose stack stays put may be a long native call or a
        // full garbage collection of a large heap: unless it answers the
        // bytecode probe there, spinning is called only after kSpinWindow
        // of it, dumps every half second meanwhile.
        const auto spin_until = start + kSpinWindow;
        // The second sample's dump came after its counters: counted from now on.
        if (j.hung && j.state == CulpritState::kSpinning)
          for (auto& s : after)
            if (s.python) s.dump_bytes += s.python->size();
        if (j.hung && j.state == CulpritState::kSpinning && dumps && runs_python_loop(j, after)) {
          j.why += " (its main thread answers a Python signal there: a Python loop, not a native "
                   "call or a garbage collection)";
          result->first = std::move(j);
          result->second = std::move(after);
          return;
        }
        while (j.hung && j.state == CulpritState::kSpinning && !token.cancelled() &&
               std::chrono::steady_clock::now() < spin_until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
          for (auto& s : after) {
            auto d = dump_python_stack(s.pid, kDumpTimeout);
            if (!d.ok) continue;
            s.dump_bytes += d.text.size();
            s.between.push_back(std::move(d.text));
          }
          for (auto& s : after) {
            const auto counters = sample_rank_counters_first(s.rank, s.pid, false, kDumpTimeout);
            s.cpu_ticks = counters.cpu_ticks;
            s.io_bytes = counters.io_bytes;
            s.state = counters.state;
            s.gone = counters.gone;
          }
          j = judge(before, after, busy_ticks, other_nodes);
        }
        result->first = std::move(j);
        result->second = std::move(after);
      },
      [this](std::function<void()> f) { boost::asio::post(io_, std::move(f)); },
      [this, result, dog, attempt = attempt_, alive = alive_.token(), done = std::move(done)] {
        // The watchdog asked is gone (a new attempt): its verdict with it.
        if (!alive || dog != dog_.get() || attempt != attempt_) return;
        evidence_samples_ = std::move(result->second);
        judgement_ = result->first;
        done(result->first.hung, result->first.why);
      });
}

void WatchdogHook::take_evidence(HangReport& report) {
  if (!report.event.by_evidence || !judgement_) return;
  const Judgement& j = *judgement_;
  report.evidence = j.why;
  report.culprit_state = j.state;
  for (const auto& s : evidence_samples_) {
    if (!s.python) continue;
    StackCapture c;
    c.global_rank = s.rank;
    c.pid = s.pid;
    c.method = StackMethod::kPythonFaulthandler;
    c.text = *s.python;
    c.note = "dumped live by the worker (ddprun's stack signal)";
    report.stacks.push_back(std::move(c));
  }
  if (j.culprits.size() == 1 && j.culprits.front() != report.culprit) {
    report.culprit = j.culprits.front();
    report.suspects.erase(std::remove(report.suspects.begin(), report.suspects.end(), report.culprit),
                          report.suspects.end());
    report.suspects.insert(report.suspects.begin(), report.culprit);
  }
}

}  // namespace ddprun::watchdog
