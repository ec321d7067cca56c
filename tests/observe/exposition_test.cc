// The exposition text: names, labels, escaping and what is left out.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "observe/exposition.h"

using ddprun::observe::escape_label_value;
using ddprun::observe::render_exposition;
using ddprun::observe::sample_line;
using nlohmann::json;

namespace {

json two_rank_status() {
  return json::parse(R"({
    "run_id": "job \"a\"\nb\\c", "host": "vm", "attempt": 1, "restarts": 1, "nodes": 1,
    "hangs": 1, "hang_culprits": {"1": 1}, "last_culprit": 1, "recoveries": 0,
    "recovery_fallbacks": 0,
    "hang_timeouts": [{"kind": "step", "timeout_s": 2.5, "learned": true}],
    "workers": [
      {"rank": 0, "state": "S sleeping", "step": 40, "beat_age_s": 0.1, "steps_per_s": 9.5,
       "cpu_seconds": 1.25, "rss_bytes": 12345, "straggler": false},
      {"rank": 1, "state": "exited 1", "step": null, "beat_age_s": null, "steps_per_s": null,
       "cpu_seconds": 0.5, "rss_bytes": 0, "straggler": true}]})");
}

}  // namespace

TEST_CASE("label values escape backslash, quote and line feed") {
  CHECK(escape_label_value("a\\b\"c\nd") == "a\\\\b\\\"c\\nd");
  CHECK(sample_line("x", {{"k", "v\""}}, 1.5) == "x{k=\"v\\\"\"} 1.5\n");
  CHECK(sample_line("x", {}, 1.0 / 0.0) == "x +Inf\n");
  CHECK(sample_line("x", {}, 3) == "x 3\n");
}

TEST_CASE("a status snapshot becomes one series per rank with Prometheus names") {
  const std::string text = render_exposition(two_rank_status(), ddprun::observe::ProcessSample{2.5, 4096});
  CHECK(text.find("# TYPE ddprun_restarts_total counter\nddprun_restarts_total 1\n") != std::string::npos);
  CHECK(text.find("ddprun_hangs_total 1\n") != std::string::npos);
  CHECK(text.find("ddprun_hang_culprit_total{rank=\"0\"} 0\n") != std::string::npos);
  CHECK(text.find("ddprun_hang_culprit_total{rank=\"1\"} 1\n") != std::string::npos);
  CHECK(text.find("ddprun_last_hang_culprit_rank 1\n") != std::string::npos);
  CHECK(text.find("ddprun_hang_timeout_seconds{kind=\"step\"} 2.5\n") != std::string::npos);
  CHECK(text.find("ddprun_hang_timeout_learned{kind=\"step\"} 1\n") != std::string::npos);
  CHECK(text.find("ddprun_worker_step{rank=\"0\"} 40\n") != std::string::npos);
  CHECK(text.find("ddprun_worker_steps_per_second{rank=\"0\"} 9.5\n") != std::string::npos);
  CHECK(text.find("ddprun_worker_cpu_seconds_total{rank=\"1\"} 0.5\n") != std::string::npos);
  CHECK(text.find("ddprun_worker_resident_memory_bytes{rank=\"0\"} 12345\n") != std::string::npos);
  CHECK(text.find("ddprun_worker_up{rank=\"1\"} 0\n") != std::string::npos);
  CHECK(text.find("ddprun_worker_straggler{rank=\"1\"} 1\n") != std::string::npos);
  CHECK(text.find("process_resident_memory_bytes 4096\n") != std::string::npos);
  CHECK(text.find("ddprun_job_info{run_id=\"job \\\"a\\\"\\nb\\\\c\",host=\"vm\"} 1\n") !=
        std::string::npos);
  // No beat yet: no sample, rather than a step of 0.
  CHECK(text.find("ddprun_worker_step{rank=\"1\"}") == std::string::npos);
  CHECK(text.find("ddprun_worker_beat_age_seconds{rank=\"1\"}") == std::string::npos);
}

TEST_CASE("every family is declared once, before its samples, and samples are contiguous") {
  const std::string text = render_exposition(two_rank_status(), std::nullopt);
  std::string current;
  std::vector<std::string> seen;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find('\n', pos);
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.rfind("# TYPE ", 0) == 0) {
      current = line.substr(7, line.find(' ', 7) - 7);
      CHECK(std::find(seen.begin(), seen.end(), current) == seen.end());
      seen.push_back(current);
    } else if (line[0] != '#') {
      const std::string name = line.substr(0, line.find_first_of("{ "));
      CHECK_MESSAGE(name == current, line);
    }
  }
  CHECK(text.find("process_cpu_seconds_total") == std::string::npos);
}

TEST_CASE("a fixed heartbeat timeout is exported as never learned") {
  json s = {{"run_id", "r"}, {"host", "h"}, {"hang_timeout_s", 5.0}, {"workers", json::array()}};
  const std::string text = render_exposition(s, std::nullopt);
  CHECK(text.find("ddprun_hang_timeout_seconds{kind=\"heartbeat\"} 5\n") != std::string::npos);
  CHECK(text.find("ddprun_hang_timeout_learned{kind=\"heartbeat\"} 0\n") != std::string::npos);
  CHECK(text.find("ddprun_last_hang_culprit_rank") == std::string::npos);
}
