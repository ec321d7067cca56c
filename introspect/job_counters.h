// JobCounters: what the job has been through so far (hangs and their
// culprits, rank recoveries), counted from the events the job records, for
// `ddprun status --json` and the metrics exporter (observe/exposition.h).
//
// Fed by the event log's tap (watchdog/event_log.h): events.jsonl is where
// the watchdog says a hang happened and whom it blamed, so the counters and
// the file can never disagree.
//
// Thread safety: none; the agent's loop thread only.
#pragma once

#include <map>
#include <nlohmann/json.hpp>

namespace ddprun::introspect {

class JobCounters {
 public:
  // One event as written to events.jsonl ({"event": ..., "culprit": ...}).
  void count(const nlohmann::json& event);

  int hangs() const { return hangs_; }
  int recoveries() const { return recoveries_; }
  // The culprit of the latest hang, -1 before any.
  int last_culprit() const { return last_culprit_; }
  // Into a status snapshot: "hangs", "hang_culprits" ({"<rank>": hangs
  // blamed on it}), "last_culprit" (null before any), "recoveries",
  // "recovery_fallbacks".
  void add_to(nlohmann::json& status) const;

 private:
  int hangs_ = 0;
  int recoveries_ = 0;
  int recovery_fallbacks_ = 0;
  int last_culprit_ = -1;
  std::map<int, int> culprits_;
};

}  // namespace ddprun::introspect
