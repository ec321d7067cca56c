#include "observe/report_html.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "observe/report_charts.h"

namespace ddprun::observe {

namespace {

constexpr const char* kStyle = R"css(
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1d2430;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
.sub{color:#5b6573;margin:0 0 16px}
.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{border:1px solid #d8dde5;border-radius:6px;padding:8px 14px;min-width:90px}
.card .v{font-size:22px;font-weight:600}.card .k{color:#5b6573;font-size:12px}
.card.bad .v{color:#c62828}.card.warn .v{color:#e65100}
.outcome{margin:12px 0;color:#333}
.legend span{margin-right:14px;font-size:12px}.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
.timeline{display:grid;grid-template-columns:120px 1fr;align-items:center;border-top:1px solid #eef0f4}
.timeline .label{font-weight:600}.timeline .label small{display:block;font-weight:400;color:#5b6573}
.timeline.straggler .label{color:#e65100}
.timeline-axis{display:grid;grid-template-columns:120px 1fr}.time-axis line{stroke:#90a4ae}
.time-axis text{font-size:9px;fill:#5b6573;text-anchor:middle}
svg{width:100%;height:auto;display:block}
.plot{fill:#fafbfc;stroke:#e3e7ed}.steps{fill:none;stroke:#1565c0;stroke-width:1.6}
.stepnote{font-size:10px;fill:#1565c0}.attempt{stroke:#90a4ae;stroke-dasharray:3 3}
.attempt-label{font-size:9px;fill:#78909c}.restart{stroke:#6a1b9a;stroke-width:2}
.exit{stroke:#455a64;stroke-width:1.6;fill:none}.recovered{fill:#2e7d32}.failed{fill:#c62828}
.hang.culprit{fill:#c62828}.hang.stalled{fill:#ffb300}.straggling{fill:#ffe0b2}
.box-chart .box{fill:#bbdefb;stroke:#1565c0}.box-chart.straggler .box{fill:#ffe0b2;stroke:#e65100}
.whisker{stroke:#607d8b}.median{stroke:#0d47a1;stroke-width:2}.none{font-size:11px;fill:#78909c}
.dist{display:grid;grid-template-columns:120px 1fr 200px;align-items:center;border-top:1px solid #eef0f4}
.badge{background:#e65100;color:#fff;border-radius:3px;padding:0 5px;font-size:11px;margin-left:6px}
.hang-card{border:1px solid #f5c6c6;border-radius:6px;padding:10px 14px;margin:8px 0;background:#fffafa}
pre{background:#f4f6f8;padding:8px;overflow:auto;font-size:12px;max-height:420px}
table{border-collapse:collapse;font-size:12px}td,th{border-bottom:1px solid #eef0f4;padding:3px 8px;text-align:left;vertical-align:top}
.notes{color:#5b6573;font-size:12px}
)css";

std::string ranks_text(const std::vector<int>& ranks) {
  if (ranks.empty()) return "none";
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

std::string card(const char* id, const std::string& value, const char* key, const char* tone,
                 const std::string& extra = "") {
  return fmt::format("<div class=\"card {}\"><div class=\"v\" id=\"{}\"{}>{}</div><div class=\"k\">{}</div></div>",
                     tone, id, extra, html_escape(value), key);
}

std::string summary(const RunHistory& run, const std::vector<int>& stragglers) {
  const int culprit = run.hangs.empty() ? -1 : run.hangs.back().culprit;
  std::string out = "<section id=\"summary\" class=\"cards\">";
  out += card("status", run.ended ? "ended" : "running", "status", "");
  out += card("ranks-count", std::to_string(run.ranks.size()), "ranks", "");
  out += card("attempts", std::to_string(run.attempts.size()), "attempts", "");
  out += card("restarts", std::to_string(run.restarts), "restarts", run.restarts ? "warn" : "");
  out += card("hangs", std::to_string(run.hangs.size()), "hangs", run.hangs.empty() ? "" : "bad");
  out += card("culprit", culprit >= 0 ? "rank " + std::to_string(culprit) : "none",
              "culprit of the last hang", culprit >= 0 ? "bad" : "",
              fmt::format(" data-rank=\"{}\"", culprit));
  out += card("recoveries", std::to_string(run.recoveries), "rank recoveries", "");
  out += card("stragglers", ranks_text(stragglers), "stragglers", stragglers.empty() ? "" : "warn");
  out += "</section>";
  if (!run.outcome.empty())
    out += "<p class=\"outcome\" id=\"outcome\">" + html_escape(run.outcome) + "</p>";
  return out;
}

std::string timelines(const RunHistory& run, const std::vector<int>& stragglers) {
  int64_t max_step = 0;
  for (const auto& [rank, points] : run.steps)
    for (const auto& p : points) max_step = std::max(max_step, p.step);
  std::string out =
      "<section id=\"timelines\"><h2>Timeline per rank</h2><p class=\"legend\">"
      "<span><i style=\"background:#1565c0\"></i>steps (shared scale, 0 to " +
      std::to_string(max_step) +
      ")</span><span><i style=\"background:#6a1b9a\"></i>restart</span>"
      "<span><i style=\"background:#c62828\"></i>hang culprit / rank failed</span>"
      "<span><i style=\"background:#ffb300\"></i>stalled by a hang</span>"
      "<span><i style=\"background:#2e7d32\"></i>rank recovered</span>"
      "<span><i style=\"background:#ffe0b2\"></i>straggling</span>"
      "<span>&#x2715; worker exit</span>" +
      fmt::format("<span>time axis: 0 to {:.1f} s</span></p>", run.duration);
  for (int rank : run.ranks) {
    const bool slow = std::find(stragglers.begin(), stragglers.end(), rank) != stragglers.end();
    const auto it = run.steps.find(rank);
    const std::string last = it == run.steps.end() || it->second.empty()
                                 ? "no steps yet"
                                 : "step " + std::to_string(it->second.back().step);
    out += fmt::format(
        "<div class=\"timeline{}\" data-rank=\"{}\"><div class=\"label\">rank {}{}<small>{}</small></div>{}</div>",
        slow ? " straggler" : "", rank, rank, slow ? "<span class=\"badge\">STRAGGLER</span>" : "",
        last, timeline_svg(run, rank, max_step));
  }
  out += "<div class=\"timeline-axis\"><div></div>" + time_axis_svg(run.duration) + "</div>";
  return out + "</section>";
}

std::string distributions(const RunHistory& run, const std::map<int, StepTimes>& times,
                          const std::vector<int>& stragglers) {
  double axis = 0;
  for (const auto& [rank, t] : times) axis = std::max(axis, t.max);
  std::string out = fmt::format(
      "<section id=\"step-times\"><h2>Step time per rank</h2><p class=\"legend\">seconds per "
      "step between progress events (box: 25% to 75%, line: median, whiskers: min to max); "
      "axis 0 to {:.4g} s</p>",
      axis);
  for (int rank : run.ranks) {
    const bool slow = std::find(stragglers.begin(), stragglers.end(), rank) != stragglers.end();
    const auto it = times.find(rank);
    const StepTimes t = it == times.end() ? StepTimes{} : it->second;
    out += fmt::format(
        "<div class=\"dist\" data-rank=\"{}\"><div class=\"label\">rank {}{}</div>{}<div>{}</div></div>", rank,
        rank, slow ? "<span class=\"badge\">STRAGGLER</span>" : "", step_time_svg(t, axis, slow),
        t.samples.empty() ? std::string("&nbsp;")
                          : fmt::format("median {:.4g} s/step ({} samples)", t.median, t.samples.size()));
  }
  return out + "</section>";
}

std::string hangs(const RunHistory& run) {
  std::string out = "<section id=\"hang-list\"><h2>Hangs</h2>";
  if (run.hangs.empty()) out += "<p>none</p>";
  for (const auto& h : run.hangs) {
    out += fmt::format(
        "<article class=\"hang-card\" data-culprit=\"{}\"><b>{:.1f} s, attempt {}: {}</b> &mdash; "
        "culprit: <b>{}</b>, stalled: {}{}<p>{}</p>",
        h.culprit, h.t, h.attempt, html_escape(h.kind),
        h.culprit >= 0 ? "rank " + std::to_string(h.culprit) : "none", ranks_text(h.stalled),
        h.culprit_state.empty() || h.culprit_state == "none"
            ? ""
            : " (culprit " + html_escape(h.culprit_state) + ")",
        html_escape(h.detail));
    if (!h.evidence.empty()) out += "<p>" + html_escape(h.evidence) + "</p>";
    if (!h.report_note.empty()) out += "<p class=\"notes\">" + html_escape(h.report_note) + "</p>";
    for (const auto& s : h.stacks) {
      out += fmt::format("<details{}><summary>rank {} stack ({}){}</summary><pre>{}</pre></details>",
                         s.rank == h.culprit ? " open" : "", s.rank, html_escape(s.method),
                         s.rank == h.culprit ? ", the culprit" : "", html_escape(s.text));
    }
    out += "</article>";
  }
  return out + "</section>";
}

std::string events(const RunHistory& run) {
  std::vector<std::pair<double, std::string>> rows;
  for (const auto& m : run.marks)
    rows.emplace_back(m.t, fmt::format("<tr><td>{:.2f} s</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                                       m.t, m.attempt, html_escape(m.kind), ranks_text(m.ranks),
                                       html_escape(m.text)));
  for (const auto& h : run.hangs)
    rows.emplace_back(h.t, fmt::format("<tr><td>{:.2f} s</td><td>{}</td><td>hang_detected</td><td>{}</td><td>{}</td></tr>",
                                       h.t, h.attempt, ranks_text(h.stalled), html_escape(h.detail)));
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out = "<section id=\"events\"><h2>Events</h2><table><tr><th>time</th><th>attempt</th>"
                    "<th>event</th><th>ranks</th><th>reason</th></tr>";
  for (const auto& r : rows) out += r.second;
  return out + "</table></section>";
}

}  // namespace

std::string render_report(const RunHistory& run) {
  const auto times = step_times(run);
  const auto stragglers = straggler_ranks(run, times);
  std::string page = "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">";
  page += "<title>ddprun report: " + html_escape(run.run_dir) + "</title>";
  page += "<style>" + std::string(kStyle) + "</style></head><body>";
  page += "<h1>ddprun run report</h1>";
  page += fmt::format("<p class=\"sub\">{} &middot; started {} &middot; {:.1f} s of events &middot; ddprun {}</p>",
                      html_escape(run.run_dir), html_escape(run.started_at), run.duration,
                      html_escape(run.version));
  page += summary(run, stragglers);
  page += timelines(run, stragglers);
  page += distributions(run, times, stragglers);
  page += hangs(run);
  page += events(run);
  if (!run.notes.empty()) {
    page += "<footer class=\"notes\">";
    for (const auto& n : run.notes) page += "<p>" + html_escape(n) + "</p>";
    page += "</footer>";
  }
  return page + "</body></html>\n";
}

}  // namespace ddprun::observe
