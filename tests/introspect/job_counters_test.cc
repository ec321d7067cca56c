// JobCounters: the job's hangs, culprits and recoveries as counted from the
// events the job records (introspect/job_counters.h).
#include <doctest/doctest.h>

#include "introspect/job_counters.h"

using ddprun::introspect::JobCounters;
using nlohmann::json;

TEST_CASE("counters: hangs with and without a culprit, recoveries, fallbacks, other events ignored") {
  JobCounters c;
  json empty = json::object();
  c.add_to(empty);
  CHECK(empty["hangs"] == 0);
  CHECK(empty["last_culprit"].is_null());
  c.count({{"event", "hang_detected"}, {"culprit", 1}});
  c.count({{"event", "hang_detected"}, {"culprit", 1}});
  c.count({{"event", "hang_detected"}, {"culprit", 3}});
  c.count({{"event", "hang_detected"}});  // no culprit: a hang all the same
  c.count({{"event", "rank_recovered"}});
  c.count({{"event", "recovery_fallback"}});
  c.count({{"event", "progress"}, {"culprit", 2}});
  c.count(json("not an object"));
  json s = json::object();
  c.add_to(s);
  CHECK(s["hangs"] == 4);
  CHECK(s["hang_culprits"] == json{{"1", 2}, {"3", 1}});
  CHECK(s["last_culprit"] == 3);
  CHECK(s["recoveries"] == 1);
  CHECK(s["recovery_fallbacks"] == 1);
}
