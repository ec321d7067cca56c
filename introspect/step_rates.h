// Per-rank step rates from heartbeat steps, and the straggler rule.
//
// The agent samples every rank's last reported step once a second; a rank's
// rate over a window is (step now - step at the window's start) / window, so
// a rank that stops beating decays to 0 instead of keeping its last rate.
// Straggler: a rank whose rate over the whole window is below
// (1 - fraction) x the median rate of the ranks with a full window. Ranks
// without steps are left out; with fewer than two ranks nothing is judged.
// Note: in lock-step data parallelism every rank advances at the slowest
// rank's pace, so rates differ only where ranks are not in lock-step (data
// loading ahead, asynchronous or pipeline stages); a lock-step straggler
// shows as its peers waiting in a collective (see `ddprun stacks`).
//
// Thread safety: none (the agent's loop thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

namespace ddprun::introspect {

using Clock = std::chrono::steady_clock;

struct StragglerOptions {
  // A rank this much slower than the median is a straggler (0.3: below 70%
  // of the median); 0 turns the detection off.
  double fraction = 0.3;
  // Over how long rates are compared; also how long a rank must have been
  // sampled before it is judged.
  std::chrono::milliseconds window{60000};
};

class StepRates {
 public:
  // The rank's latest step at `now` (call about once a second per rank).
  void sample(int rank, Clock::time_point now, int64_t step);
  void forget(int rank);
  void clear() { samples_.clear(); }

  // Steps per second over the last `window` (or the history there is, if
  // shorter and `require_full` is false); nullopt with under 1 s of history.
  std::optional<double> rate(int rank, std::chrono::milliseconds window,
                             bool require_full = false) const;
  // Ranks that are stragglers now, slowest first.
  std::vector<int> stragglers(const StragglerOptions& options) const;
  // Median of the full-window rates (nullopt when fewer than two ranks).
  std::optional<double> median_rate(std::chrono::milliseconds window) const;

 private:
  struct Sample {
    Clock::time_point t;
    int64_t step;
  };
  std::map<int, std::deque<Sample>> samples_;
  std::chrono::milliseconds keep_{600000};
};

}  // namespace ddprun::introspect
