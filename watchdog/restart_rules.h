// RestartRules: pure decision logic for "restart the group or stop?".
//
// Rules, checked in this order after each failed attempt:
//  1. an exit code listed in no_restart_exit_codes (e.g. 2, a usage error)
//     stops at once: retrying cannot help;
//  2. max_restarts: the attempt was the last allowed;
//  3. no progress: the last max_no_progress_restarts attempts in a row did
//     not raise the job's highest heartbeat step (attempts with no step at
//     all count as "no progress" only once some attempt reported a step);
// otherwise restart: the first restart at once, later ones after an
// exponential back-off of backoff_initial, doubling per restart, capped at
// backoff_max.
//
// Thread safety: none needed (plain value type, no I/O).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::watchdog {

struct RestartRulesOptions {
  // Restarts allowed after the first attempt (torchrun's --max-restarts).
  int max_restarts = 0;
  // Delay before the second restart (the first is immediate); each further
  // restart doubles it.
  std::chrono::milliseconds backoff_initial{100};
  // Upper bound of the delay.
  std::chrono::milliseconds backoff_max{30000};
  // Stop after this many consecutive attempts without step progress; 0 = off.
  int max_no_progress_restarts = 0;
  // Worker exit codes that mean "do not restart".
  std::vector<int> no_restart_exit_codes;
};

struct AttemptOutcome {
  // Restarts the job had spent when the attempt started: its
  // TORCHELASTIC_RESTART_COUNT, job-wide across nodes (the one count).
  int restart_count = 0;
  bool succeeded = false;
  bool hang = false;
  // Exit codes of workers that failed by exiting (signals as 128+N).
  std::vector<int> exit_codes;
  // Highest heartbeat step of the attempt; -1 when none was reported.
  int64_t max_step = -1;
};

enum class StopRule { kRestart, kSucceeded, kNoRestartExitCode, kMaxRestarts, kNoProgress };
const char* to_string(StopRule rule);

struct RuleDecision {
  bool restart = false;
  StopRule rule = StopRule::kRestart;
  // Back-off before the next attempt (restart only).
  std::chrono::milliseconds delay{0};
  // One sentence for the summary, naming the rule and its flag.
  std::string reason;
};

class RestartRules {
 public:
  explicit RestartRules(RestartRulesOptions options) : options_(std::move(options)) {}

  // Records the outcome of the attempt that just ended and decides.
  RuleDecision on_attempt_end(const AttemptOutcome& outcome);

  int64_t best_step() const { return best_step_; }
  int no_progress_streak() const { return no_progress_streak_; }

 private:
  RestartRulesOptions options_;
  int64_t best_step_ = -1;
  int no_progress_streak_ = 0;
};

}  // namespace ddprun::watchdog
