#include "observe/run_history.h"

#include <errno.h>
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "base/contract.h"
#include "base/safe_file.h"

namespace ddprun::observe {

namespace {

using nlohmann::json;

// Far above any real run's log (a week of progress events at 1 s on 64
// ranks is some 400 MiB): a report is built in memory.
constexpr size_t kMaxEventsBytes = size_t(1) << 30;
constexpr size_t kMaxHangReportBytes = size_t(64) << 20;

std::vector<int> int_list(const json& j) {
  std::vector<int> out;
  if (!j.is_array()) return out;
  for (const auto& x : j)
    if (x.is_number_integer()) out.push_back(x.get<int>());
  return out;
}

// The attempt's hang report's stacks, culprit's first; a defect names the file.
void add_stacks(Hang& hang, const std::string& text, const std::string& path) {
  json report;
  try {
    report = json::parse(text);
  } catch (const json::exception& e) {
    throw ReportInputError(path + ": not JSON (" + e.what() + ")");
  }
  if (!report.is_object()) throw ReportInputError(path + ": not a JSON object");
  if (hang.culprit < 0 && report.contains("culprit_rank") && report["culprit_rank"].is_number_integer())
    hang.culprit = report["culprit_rank"].get<int>();
  const auto stacks = report.find("stacks");
  if (stacks == report.end() || !stacks->is_array()) return;
  for (const auto& s : *stacks) {
    if (!s.is_object()) throw ReportInputError(path + ": a stack entry is not an object");
    StackText st{s.value("rank", -1), s.value("method", ""), s.value("text", "")};
    if (st.text.empty()) st.text = s.value("note", "");
    hang.stacks.push_back(std::move(st));
  }
  std::stable_sort(hang.stacks.begin(), hang.stacks.end(), [&](const auto& a, const auto& b) {
    return (a.rank == hang.culprit) > (b.rank == hang.culprit);
  });
}

class Reader {
 public:
  Reader(RunHistory& run, const HangReportSource& hang_reports)
      : run_(run), hang_reports_(hang_reports) {}

  void line(const json& e, double t) {
    const std::string kind = e.value("event", "");
    const int attempt = e.value("attempt", 0);
    const auto ranks = int_list(e.value("ranks", json::array()));
    const std::string reason = e.value("reason", "");
    if (kind == "rendezvous") {
      run_.attempts.push_back({attempt, t, ranks});
      ranks_.insert(ranks.begin(), ranks.end());
    } else if (kind == "progress") {
      const auto steps = e.value("steps", json::array());
      for (size_t i = 0; i < ranks.size() && i < steps.size(); ++i) {
        if (!steps[i].is_number_integer()) continue;
        run_.steps[ranks[i]].push_back({t, steps[i].get<int64_t>(), attempt});
        ranks_.insert(ranks[i]);
      }
    } else if (kind == "hang_detected") {
      hang(e, t, attempt, ranks, reason);
    } else if (kind == "straggler" || kind == "straggler_recovered") {
      for (int r : ranks) straggler(r, t, kind == "straggler");
      run_.marks.push_back({t, kind, ranks, reason, attempt});
    } else if (kind == "worker_exit" || kind == "restart" || kind == "rank_failed" ||
               kind == "rank_recovered" || kind == "recovery_fallback") {
      if (kind == "restart") ++run_.restarts;
      if (kind == "rank_recovered") ++run_.recoveries;
      run_.marks.push_back({t, kind, ranks, reason, attempt});
    } else if (kind == "done") {
      run_.ended = true;
      run_.outcome = reason;
    } else if (kind == "events_dropped") {
      run_.notes.push_back("the agent dropped events: " + reason);
    }
  }

  void finish() {
    run_.ranks.assign(ranks_.begin(), ranks_.end());
    for (auto& [rank, spans] : run_.straggling)
      for (auto& span : spans)
        if (span.second < 0) span.second = run_.duration;
  }

 private:
  void hang(const json& e, double t, int attempt, const std::vector<int>& ranks,
            const std::string& reason) {
    Hang h;
    h.t = t;
    h.attempt = attempt;
    h.kind = e.value("kind", "");
    h.culprit = e.contains("culprit") && e["culprit"].is_number_integer() ? e["culprit"].get<int>()
                                                                          : -1;
    h.stalled = ranks;
    h.detail = reason;
    h.evidence = e.value("evidence", "");
    h.culprit_state = e.value("culprit_state", "");
    const auto text = hang_reports_(attempt);
    if (text) {
      add_stacks(h, *text, hang_report_path(run_.run_dir, attempt));
    } else {
      h.report_note = "no " + std::string(base::kFileHangReportJson) + " in " +
                      base::kFileAttemptDirPrefix + std::to_string(attempt) + "/ (yet)";
    }
    ranks_.insert(ranks.begin(), ranks.end());
    run_.hangs.push_back(std::move(h));
  }

  void straggler(int rank, double t, bool starts) {
    auto& spans = run_.straggling[rank];
    if (starts) {
      if (spans.empty() || spans.back().second >= 0) spans.push_back({t, -1});
    } else if (!spans.empty() && spans.back().second < 0) {
      spans.back().second = t;
    }
  }

  RunHistory& run_;
  const HangReportSource& hang_reports_;
  std::set<int> ranks_;
};

}  // namespace

std::string hang_report_path(const std::string& run_dir, int attempt) {
  return fmt::format("{}/{}{}/{}", run_dir, base::kFileAttemptDirPrefix, attempt,
                     base::kFileHangReportJson);
}

RunHistory parse_run(const std::string& run_dir, const std::string& text,
                     const HangReportSource& hang_report) {
  RunHistory run;
  run.run_dir = run_dir;
  const std::string name = run_dir + "/" + base::kFileEvents;
  Reader reader(run, hang_report);
  double first = 0;
  bool any = false;
  size_t pos = 0;
  for (int number = 1; pos < text.size(); ++number) {
    const size_t end = text.find('\n', pos);
    if (end == std::string::npos) {
      // The writer appends whole lines; a tail without its newline is one
      // still being written (or cut by a full disk): left out.
      run.notes.push_back(fmt::format("{}:{}: an unfinished last line was left out", name, number));
      break;
    }
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty()) continue;
    json e;
    try {
      e = json::parse(line);
    } catch (const json::exception& ex) {
      throw ReportInputError(fmt::format("{}:{}: not JSON ({})", name, number, ex.what()));
    }
    if (!e.is_object() || !e.contains("event") || !e["event"].is_string())
      throw ReportInputError(fmt::format("{}:{}: not an event (no \"event\" name)", name, number));
    // events_dropped carries no clock: it belongs where it stands.
    double t = run.duration;
    if (e.contains("monotonic_s") && e["monotonic_s"].is_number()) {
      const double mono = e["monotonic_s"].get<double>();
      if (!any) {
        first = mono;
        any = true;
        run.started_at = e.value("time", "");
      }
      t = std::max(0.0, mono - first);
      run.duration = std::max(run.duration, t);
    }
    if (run.version.empty()) run.version = e.value("ddprun_version", "");
    reader.line(e, t);
  }
  if (!any) throw ReportInputError(name + ": no events yet");
  reader.finish();
  return run;
}

RunHistory read_run(const std::string& run_dir) {
  std::string text;
  std::optional<base::SafeDir> dir;
  try {
    dir.emplace(base::SafeDir::open(run_dir));
  } catch (const base::FileError& e) {
    throw ReportInputError(std::string("run folder: ") + e.what());
  }
  try {
    text = dir->read_file(base::kFileEvents, kMaxEventsBytes);
  } catch (const base::FileError& e) {
    throw ReportInputError(e.what());
  }
  auto hang_report = [&](int attempt) -> std::optional<std::string> {
    try {
      const std::string folder = base::kFileAttemptDirPrefix + std::to_string(attempt);
      return dir->subdir(folder, false).read_file(base::kFileHangReportJson, kMaxHangReportBytes);
    } catch (const base::FileError& e) {
      if (e.error() == ENOENT) return std::nullopt;
      throw ReportInputError(e.what());
    }
  };
  return parse_run(run_dir, text, hang_report);
}

}  // namespace ddprun::observe
