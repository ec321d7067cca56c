#include "watchdog/job_restart_policy.h"

#include "watchdog/agent_hook.h"

namespace ddprun::watchdog {

agent::RestartDecision JobRestartPolicy::decide(const agent::AttemptResult& failed,
                                                int max_restarts) {
  if (!rules_) {
    options_.max_restarts = max_restarts;
    rules_.emplace(options_);
  }
  AttemptOutcome o;
  // Replacements of single ranks (--restart-scope=rank) spent restarts too.
  o.restart_count = failed.restart_count + failed.rank_restarts;
  o.hang = hook_ && hook_->last_attempt_hung();
  // Without restarts the rules below stop anyway (rule max_restarts).
  if (hook_ && hook_->last_hang_ends_job() && max_restarts > 0) {
    if (auto* ev = hook_->events()) {
      ev->write("done", failed.restart_count, {}, "failed: freeze detected (--on-hang=exit)",
                {{"rule", "on_hang_exit"}, {"hang", true}, {"max_step", hook_->last_attempt_max_step()}});
    }
    agent::RestartDecision out;
    out.restart = false;
    out.why = "a freeze was detected and --on-hang is exit (the default without --max-restarts)";
    return out;
  }
  o.max_step = hook_ ? hook_->last_attempt_max_step() : -1;
  // Only the root cause's own exit code: the rest were stopped by teardown.
  if (failed.root && failed.root->status) o.exit_codes.push_back(failed.root->status->shell_code());
  const RuleDecision d = rules_->on_attempt_end(o);
  if (auto* ev = hook_ ? hook_->events() : nullptr) {
    ev->write(d.restart ? "restart" : "done", failed.restart_count, {},
              d.restart ? d.reason : "failed: " + d.reason,
              {{"rule", to_string(d.rule)}, {"delay_ms", d.delay.count()},
               {"hang", o.hang}, {"max_step", o.max_step}});
  }
  agent::RestartDecision out;
  out.restart = d.restart;
  out.delay = d.delay;
  out.why = d.reason;
  return out;
}

}  // namespace ddprun::watchdog
