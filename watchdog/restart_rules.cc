#include "watchdog/restart_rules.h"

#include <fmt/format.h>

#include <algorithm>

namespace ddprun::watchdog {

const char* to_string(StopRule rule) {
  switch (rule) {
    case StopRule::kRestart: return "restart";
    case StopRule::kSucceeded: return "succeeded";
    case StopRule::kNoRestartExitCode: return "no_restart_exit_code";
    case StopRule::kMaxRestarts: return "max_restarts";
    case StopRule::kNoProgress: return "no_progress";
  }
  return "unknown";
}

RuleDecision RestartRules::on_attempt_end(const AttemptOutcome& outcome) {
  RuleDecision d;
  // Progress bookkeeping first: every attempt counts, whatever stops us.
  if (outcome.max_step > best_step_) {
    best_step_ = outcome.max_step;
    no_progress_streak_ = 0;
  } else if (best_step_ >= 0) {
    ++no_progress_streak_;
  }
  if (outcome.succeeded) {
    d.rule = StopRule::kSucceeded;
    d.reason = "all workers succeeded";
    return d;
  }
  for (int code : outcome.exit_codes) {
    const auto& stop = options_.no_restart_exit_codes;
    if (std::find(stop.begin(), stop.end(), code) != stop.end()) {
      d.rule = StopRule::kNoRestartExitCode;
      d.reason = fmt::format("a worker exited with code {}, listed in --no-restart-exit-codes, "
                             "so the job was not restarted",
                             code);
      return d;
    }
  }
  const int done = outcome.restart_count;
  if (done >= options_.max_restarts) {
    d.rule = StopRule::kMaxRestarts;
    d.reason = fmt::format("--max-restarts={} reached ({} restart(s) done)", options_.max_restarts,
                           done);
    return d;
  }
  if (options_.max_no_progress_restarts > 0 &&
      no_progress_streak_ >= options_.max_no_progress_restarts) {
    d.rule = StopRule::kNoProgress;
    d.reason = fmt::format("{} consecutive attempt(s) did not advance past step {} "
                           "(--max-no-progress-restarts={})",
                           no_progress_streak_, best_step_, options_.max_no_progress_restarts);
    return d;
  }
  // The first restart is immediate: a one-off crash should cost no more
  // than the restart itself. Back-off starts with the second, for crash
  // loops. Doubling without overflow: stop doubling once at the cap.
  if (done > 0) {
    auto delay = options_.backoff_initial;
    for (int i = 1; i < done && delay < options_.backoff_max; ++i) delay *= 2;
    d.delay = std::min(delay, options_.backoff_max);
  }
  d.restart = true;
  d.rule = StopRule::kRestart;
  d.reason = fmt::format("restart {} of {} after {} ms back-off{}", done + 1,
                         options_.max_restarts, d.delay.count(),
                         outcome.hang ? " (hang)" : "");
  return d;
}

}  // namespace ddprun::watchdog
