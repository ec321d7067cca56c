// The page of `ddprun report`: one self-contained HTML file (inline CSS and
// SVG, no script, nothing fetched) from a RunHistory: a summary (status,
// ranks, restarts, hangs and the culprit, recoveries, stragglers), a
// timeline per rank, step-time distributions, each hang with its stacks,
// and the events. Elements tests look for carry ids: #status, #restarts,
// #hangs, #culprit (data-rank), #recoveries, #stragglers, and one
// .timeline[data-rank] per rank.
//
// Thread safety: a pure function.
#pragma once

#include <string>

#include "observe/run_history.h"

namespace ddprun::observe {

std::string render_report(const RunHistory& run);

}  // namespace ddprun::observe
