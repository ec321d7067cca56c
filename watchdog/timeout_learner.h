// TimeoutLearner: the hang timeouts learned from one job's own rhythm.
//
// The watchdog feeds it every observed duration: "step" (the gap between two
// progress beats of one rank: an optimizer step, a beat(), a forward pass),
// "setup" (spawn to a rank's first beat) and each section kind's duration
// ("checkpoint", ...), from every rank of the node. A kind's timeout is
//
//   max(floor, factor x max(p99, observed maximum))
//
// (NVRx's calculated timeouts are observed maximum x 5; with the same factor
// and a floor on top this is never less safe). Until a kind has
// min_samples durations, its timeout is the kind's conservative initial
// value, never less than the learned one. Timeouts only grow within a job:
// a longer duration (an evaluation pass between two steps) widens them, and
// nothing narrows them again.
//
// One learner per job: the agent's hook owns it and hands it to each
// attempt's Watchdog, so a restarted attempt judges its first step by what
// the earlier attempts learned.
//
// Thread safety: none; the agent's loop thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

namespace ddprun::watchdog {

struct LearnerOptions {
  using Millis = std::chrono::milliseconds;
  // No learned timeout is below this (--hang-timeout-floor): a GC pause, a
  // data loader respawning its workers at an epoch boundary, or a page-cache
  // stall can stop a 1 ms-step job for seconds without it being hung.
  Millis floor{kDefaultFloor};
  // Learned timeout = factor x the longest duration seen (NVRx uses 5).
  double factor = 5.0;
  // Durations a kind needs before its learned timeout replaces the initial one.
  int min_step_samples = 10;
  int min_section_samples = 2;
  // Before anything is learned: torch's default collective timeout (10 min;
  // a rank waiting that long in an NCCL collective is ended by torch anyway),
  // so ddprun's guess never fires before torch's own would.
  Millis initial_step{600000};
  Millis initial_section{600000};
  // Spawn to the first beat (imports, data loading, compilation): a setup
  // that outlasts it is not a hang, ddprun only says detection is off until
  // the rank's first beat.
  Millis initial_setup{600000};
  // The evidence rule (watchdog/evidence.h): a step stall is judged from
  // what the ranks are doing once the learned bound (factor x the longest
  // gap, without the floor) passes, but never before this: a stall shorter
  // than a second is the scheduler's, not the program's.
  Millis min_evidence_bound{1000};

  static constexpr Millis kDefaultFloor{60000};
};

// What one kind's timeout is and what it was learned from.
struct LearnedTimeout {
  std::string kind;
  std::chrono::milliseconds timeout{0};
  uint64_t samples = 0;
  std::chrono::milliseconds p99{0};
  std::chrono::milliseconds max{0};
  // False while the initial value applies (too few samples).
  bool learned = false;
  // "step: 41 s, from 1,200 durations, p99 0.8 s, max 8.1 s" or
  // "checkpoint: 600 s (initial; 1 duration so far, needs 2)".
  std::string describe() const;
};

class TimeoutLearner {
 public:
  using Millis = std::chrono::milliseconds;
  static constexpr const char* kStep = "step";
  static constexpr const char* kSetup = "setup";
  static constexpr const char* kOther = "other sections";
  // All kinds at most: step, setup, kOther and kMaxNamedKinds section names.
  static constexpr std::size_t kMaxKinds = 32;
  static constexpr std::size_t kMaxNamedKinds = kMaxKinds - 3;

  explicit TimeoutLearner(LearnerOptions options = {}) : options_(options) {}

  // Section names come from workers: past kMaxNamedKinds names, a new name's
  // durations are learned as kOther's. Returns true for the first such fold
  // (the caller says so once).
  bool add(const std::string& kind, std::chrono::steady_clock::duration sample);
  // The timeout of `kind` now ("step", "setup" or a section's name). Called
  // per beat: O(1) in the samples (the basis is the running max, which the
  // window's p99 never exceeds); the quantile is computed only by explain().
  Millis timeout(const std::string& kind) const;
  LearnedTimeout explain(const std::string& kind) const;
  // A step's or section's learned bound without the floor, when it is
  // learned and below the floor (the evidence rule acts there); 0 otherwise
  // (and always for setup). O(1).
  Millis evidence_bound(const std::string& kind = kStep) const;
  // Every kind seen, plus "step" and "setup" always.
  std::vector<LearnedTimeout> all() const;
  const LearnerOptions& options() const { return options_; }
  // Quantiles computed so far (explain()): what a test counts to see that
  // timeout() does no work proportional to the samples.
  uint64_t quantiles_computed() const { return quantiles_computed_; }

 private:
  struct Samples {
    uint64_t count = 0;
    Millis max{0};
    // The most recent kWindow durations, for the quantile shown.
    std::deque<Millis> recent;
  };
  static constexpr std::size_t kWindow = 4096;

  Millis initial(const std::string& kind) const;
  int min_samples(const std::string& kind) const;
  // The samples `kind` is learned from: its own, or kOther's once folded.
  const Samples* samples_of(const std::string& kind) const;
  Millis timeout_from(const std::string& kind, const Samples* s) const;

  LearnerOptions options_;
  std::map<std::string, Samples> kinds_;
  std::size_t named_kinds_ = 0;
  bool folded_ = false;
  mutable uint64_t quantiles_computed_ = 0;
};

}  // namespace ddprun::watchdog
