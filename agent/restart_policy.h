// Whether a failed attempt is followed by another one, and when.
//
// The agent asks the policy after every failed attempt (never after success
// or a signal). The default restarts while restart_count < max_restarts,
// like torchrun (with --restart-scope=rank, restarts spent replacing single
// ranks count too); backoff or no-progress rules replace it.
#pragma once

#include <chrono>
#include <string>

#include "agent/attempt_types.h"

namespace ddprun::agent {

struct RestartDecision {
  bool restart = false;
  std::chrono::milliseconds delay{0};  // wait before the next attempt
  std::string why;                     // shown when not restarting; may be empty
};

class RestartPolicy {
 public:
  virtual ~RestartPolicy() = default;
  virtual RestartDecision decide(const AttemptResult& failed, int max_restarts) = 0;
};

class MaxRestartsPolicy : public RestartPolicy {
 public:
  RestartDecision decide(const AttemptResult& failed, int max_restarts) override {
    RestartDecision d;
    d.restart = failed.restart_count + failed.rank_restarts < max_restarts;
    if (!d.restart)
      d.why = max_restarts == 0 ? "no restarts allowed (--max-restarts=0)"
                                : "restart limit reached (--max-restarts=" +
                                      std::to_string(max_restarts) + ")";
    return d;
  }
};

}  // namespace ddprun::agent
