#include "introspect/job_counters.h"

#include <string>

namespace ddprun::introspect {

void JobCounters::count(const nlohmann::json& event) {
  if (!event.is_object()) return;
  const std::string kind = event.value("event", "");
  if (kind == "hang_detected") {
    ++hangs_;
    // An event without a culprit (an older build, a report without stacks)
    // still counts as a hang, blamed on nobody.
    const auto culprit = event.find("culprit");
    if (culprit != event.end() && culprit->is_number_integer() && culprit->get<int>() >= 0) {
      last_culprit_ = culprit->get<int>();
      ++culprits_[last_culprit_];
    }
  } else if (kind == "rank_recovered") {
    ++recoveries_;
  } else if (kind == "recovery_fallback") {
    ++recovery_fallbacks_;
  }
}

void JobCounters::add_to(nlohmann::json& status) const {
  nlohmann::json culprits = nlohmann::json::object();
  for (const auto& [rank, n] : culprits_) culprits[std::to_string(rank)] = n;
  status["hangs"] = hangs_;
  status["hang_culprits"] = culprits;
  status["last_culprit"] = last_culprit_ >= 0 ? nlohmann::json(last_culprit_) : nlohmann::json();
  status["recoveries"] = recoveries_;
  status["recovery_fallbacks"] = recovery_fallbacks_;
}

}  // namespace ddprun::introspect
