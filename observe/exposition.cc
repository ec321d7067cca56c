#include "observe/exposition.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <functional>
#include <map>

#include "introspect/proc_usage.h"

namespace ddprun::observe {

namespace {

using nlohmann::json;

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);  // shortest text that reads back as v
}

// HELP text escapes only backslash and line feed (the format's rule).
std::string escape_help(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

// A number from the snapshot, or nullopt where it is null or missing.
std::optional<double> number(const json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

class Writer {
 public:
  void family(std::string_view name, std::string_view type, std::string_view help) {
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, escape_help(help), name, type);
  }
  void sample(std::string_view name, const Labels& labels, double value) {
    out_ += sample_line(name, labels, value);
  }
  // One family with one sample per worker that has the value.
  void per_rank(const json& workers, std::string_view name, std::string_view type,
                std::string_view help, const std::function<std::optional<double>(const json&)>& value) {
    std::string lines;
    for (const auto& w : workers) {
      if (const auto v = value(w)) lines += sample_line(name, {{"rank", rank_of(w)}}, *v);
    }
    if (lines.empty()) return;
    family(name, type, help);
    out_ += lines;
  }
  static std::string rank_of(const json& worker) {
    return std::to_string(worker.value("rank", -1));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

void job_families(Writer& w, const json& s) {
  Labels info = {{"run_id", s.value("run_id", "")}, {"host", s.value("host", "")}};
  if (const auto node = number(s, "node")) info.emplace_back("node", format_value(*node));
  w.family("ddprun_job_info", "gauge", "The job this agent runs: run id, host, node (group rank)");
  w.sample("ddprun_job_info", info, 1);
  w.family("ddprun_nodes", "gauge", "Nodes in the job's current round");
  w.sample("ddprun_nodes", {}, number(s, "nodes").value_or(1));
  w.family("ddprun_attempt", "gauge", "The attempt now running (its attempt_<n> log folder)");
  w.sample("ddprun_attempt", {}, number(s, "attempt").value_or(0));
  w.family("ddprun_restarts_total", "counter", "Restarts of the worker group so far");
  w.sample("ddprun_restarts_total", {}, number(s, "restarts").value_or(0));
  w.family("ddprun_hangs_total", "counter", "Hangs the watchdog detected so far");
  w.sample("ddprun_hangs_total", {}, number(s, "hangs").value_or(0));
  w.family("ddprun_recoveries_total", "counter",
           "Single ranks replaced and rejoined without a group restart (--restart-scope=rank)");
  w.sample("ddprun_recoveries_total", {}, number(s, "recoveries").value_or(0));
  w.family("ddprun_recovery_fallbacks_total", "counter",
           "Rank recoveries given up for a group restart");
  w.sample("ddprun_recovery_fallbacks_total", {}, number(s, "recovery_fallbacks").value_or(0));
}

void hang_families(Writer& w, const json& s, const json& workers) {
  // Every rank of the attempt has a series, 0 until blamed, so an alert on
  // increase() sees the first hang; a culprit no longer among the workers
  // (an earlier round's) keeps its count.
  std::map<int, double> blamed;
  for (const auto& worker : workers) blamed[worker.value("rank", -1)] = 0;
  if (const auto it = s.find("hang_culprits"); it != s.end() && it->is_object()) {
    for (const auto& [rank, n] : it->items()) {
      try {
        if (n.is_number()) blamed[std::stoi(rank)] = n.get<double>();
      } catch (const std::exception&) {
      }
    }
  }
  if (!blamed.empty()) {
    w.family("ddprun_hang_culprit_total", "counter", "Hangs blamed on each rank (the culprit)");
    for (const auto& [rank, n] : blamed)
      w.sample("ddprun_hang_culprit_total", {{"rank", std::to_string(rank)}}, n);
  }
  if (const auto last = number(s, "last_culprit")) {
    w.family("ddprun_last_hang_culprit_rank", "gauge", "The culprit rank of the latest hang");
    w.sample("ddprun_last_hang_culprit_rank", {}, *last);
  }
  // Learned bounds, one per kind of wait; a fixed --heartbeat-timeout is
  // the heartbeat kind's, never learned.
  std::vector<std::pair<Labels, std::pair<double, bool>>> bounds;
  if (const auto it = s.find("hang_timeouts"); it != s.end() && it->is_array()) {
    for (const auto& t : *it) {
      if (const auto v = number(t, "timeout_s"))
        bounds.push_back({{{"kind", t.value("kind", "")}}, {*v, t.value("learned", false)}});
    }
  } else if (const auto fixed = number(s, "hang_timeout_s")) {
    bounds.push_back({{{"kind", "heartbeat"}}, {*fixed, false}});
  }
  if (bounds.empty()) return;
  w.family("ddprun_hang_timeout_seconds", "gauge",
           "How long a wait of this kind may last before it counts as a hang");
  for (const auto& [labels, b] : bounds) w.sample("ddprun_hang_timeout_seconds", labels, b.first);
  w.family("ddprun_hang_timeout_learned", "gauge",
           "1 when the bound was learned from the job's own waits, 0 while it is the floor or fixed");
  for (const auto& [labels, b] : bounds)
    w.sample("ddprun_hang_timeout_learned", labels, b.second ? 1 : 0);
}

void worker_families(Writer& w, const json& workers) {
  w.per_rank(workers, "ddprun_worker_up", "gauge", "1 while the rank's process runs",
             [](const json& x) -> std::optional<double> {
               return x.value("state", "").rfind("exited", 0) == 0 ? 0 : 1;
             });
  w.per_rank(workers, "ddprun_worker_step", "gauge", "The step of the rank's latest heartbeat",
             [](const json& x) { return number(x, "step"); });
  w.per_rank(workers, "ddprun_worker_steps_per_second", "gauge",
             "The rank's heartbeat steps per second over the last 10 s",
             [](const json& x) { return number(x, "steps_per_s"); });
  w.per_rank(workers, "ddprun_worker_beat_age_seconds", "gauge",
             "Seconds since the rank's latest heartbeat", [](const json& x) {
               return number(x, "beat_age_s");
             });
  w.per_rank(workers, "ddprun_worker_straggler", "gauge",
             "1 while the rank's step rate is below the straggler bound",
             [](const json& x) -> std::optional<double> { return x.value("straggler", false); });
  w.per_rank(workers, "ddprun_worker_cpu_seconds_total", "counter",
             "CPU time of the rank's process (user + system)",
             [](const json& x) { return number(x, "cpu_seconds"); });
  // rss_bytes is 0, not null, before the first sample: cpu_seconds tells.
  w.per_rank(workers, "ddprun_worker_resident_memory_bytes", "gauge",
             "Resident memory of the rank's process",
             [](const json& x) -> std::optional<double> {
               if (!number(x, "cpu_seconds")) return std::nullopt;
               return number(x, "rss_bytes");
             });
}

}  // namespace

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string sample_line(std::string_view name, const Labels& labels, double value) {
  std::string line(name);
  if (!labels.empty()) {
    line += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i) line += ',';
      line += labels[i].first + "=\"" + escape_label_value(labels[i].second) + '"';
    }
    line += '}';
  }
  return line + ' ' + format_value(value) + '\n';
}

std::optional<ProcessSample> sample_this_process() {
  const auto usage = introspect::read_proc_usage(::getpid());
  if (!usage) return std::nullopt;
  return ProcessSample{
      static_cast<double>(usage->cpu_ticks) / static_cast<double>(introspect::clock_ticks_per_second()),
      usage->rss_bytes};
}

std::string render_exposition(const json& status, const std::optional<ProcessSample>& self) {
  Writer w;
  const json workers = status.contains("workers") && status["workers"].is_array()
                           ? status["workers"]
                           : json::array();
  job_families(w, status);
  hang_families(w, status, workers);
  worker_families(w, workers);
  if (self) {
    w.family("process_cpu_seconds_total", "counter", "CPU time of the ddprun agent (user + system)");
    w.sample("process_cpu_seconds_total", {}, self->cpu_seconds);
    w.family("process_resident_memory_bytes", "gauge", "Resident memory of the ddprun agent");
    w.sample("process_resident_memory_bytes", {}, static_cast<double>(self->resident_bytes));
  }
  return w.take();
}

}  // namespace ddprun::observe
