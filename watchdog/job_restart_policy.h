// JobRestartPolicy: restart_rules.h's RestartRules behind the agent's
// RestartPolicy seam (agent/restart_policy.h), using the watchdog hook's
// knowledge of the attempt (hang, highest step); both write the job's
// events.jsonl.
//
// Thread safety: the agent's loop thread only.
#pragma once

#include <optional>

#include "agent/restart_policy.h"
#include "watchdog/restart_rules.h"

namespace ddprun::watchdog {

class WatchdogHook;

class JobRestartPolicy : public agent::RestartPolicy {
 public:
  explicit JobRestartPolicy(RestartRulesOptions options) : options_(std::move(options)) {}
  // The hook whose attempt knowledge (hang, highest step) feeds the rules;
  // without one, every attempt counts as "no step reported".
  void attach(WatchdogHook* hook) { hook_ = hook; }
  agent::RestartDecision decide(const agent::AttemptResult& failed, int max_restarts) override;

 private:
  RestartRulesOptions options_;
  std::optional<RestartRules> rules_;
  WatchdogHook* hook_ = nullptr;
};

}  // namespace ddprun::watchdog
