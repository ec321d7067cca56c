// The pictures of `ddprun report` as inline SVG (no script, no network):
// a timeline per rank and a step-time box plot per rank, from a RunHistory
// (run_history.h). Every text placed in the page goes through html_escape:
// reasons and stacks hold whatever the workers printed.
//
// Thread safety: pure functions.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "observe/run_history.h"

namespace ddprun::observe {

std::string html_escape(std::string_view text);

// Seconds per step between consecutive progress events of one rank in one
// attempt (the mean over that interval: heartbeats are not timed one by
// one), and their quartiles.
struct StepTimes {
  std::vector<double> samples;
  double min = 0, p25 = 0, median = 0, p75 = 0, max = 0;
};
std::map<int, StepTimes> step_times(const RunHistory& run);

// Ranks marked as stragglers: those the agent reported (straggler events),
// and those whose median step time is over 1 / (1 - 0.3) times the median
// of every rank's median (the agent's default --straggler-fraction), which
// a run shorter than the agent's window never reported.
std::vector<int> straggler_ranks(const RunHistory& run, const std::map<int, StepTimes>& times);

// One rank's row: steps over time (one line per attempt), attempt starts,
// restarts, exits, hangs (culprit and stalled), recoveries, straggling.
// The y scale is shared (`max_step`), so a lagging rank shows.
std::string timeline_svg(const RunHistory& run, int rank, int64_t max_step);

// The seconds under the timelines: ticks on the same x scale.
std::string time_axis_svg(double duration);

// One rank's step times as a box plot on a shared axis (0..axis_max s).
std::string step_time_svg(const StepTimes& times, double axis_max, bool straggler);

}  // namespace ddprun::observe
