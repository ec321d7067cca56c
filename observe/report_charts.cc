#include "observe/report_charts.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace ddprun::observe {

namespace {

constexpr double kWidth = 960, kRowHeight = 64, kLeft = 8, kRight = 8, kTop = 6, kBottom = 14;
constexpr double kStragglerFraction = 0.3;  // the agent's --straggler-fraction default

double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - static_cast<double>(lo));
}

std::string title(std::string_view text) { return "<title>" + html_escape(text) + "</title>"; }

bool has(const std::vector<int>& ranks, int rank) {
  return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
}

// Seconds since the start to x, for the shared time axis of every row.
struct TimeAxis {
  double duration;
  double x(double t) const {
    return kLeft + (kWidth - kLeft - kRight) * (duration > 0 ? t / duration : 0);
  }
};

std::string step_lines(const std::vector<StepPoint>& points, const TimeAxis& axis,
                       int64_t max_step) {
  const double plot = kRowHeight - kTop - kBottom;
  auto y = [&](int64_t step) {
    return kTop + plot * (1 - (max_step > 0 ? static_cast<double>(step) / max_step : 0));
  };
  std::string out;
  std::string line;
  int attempt = points.empty() ? 0 : points.front().attempt;
  auto flush = [&] {
    if (!line.empty())
      out += "<polyline class=\"steps\" points=\"" + line + "\"><title>steps, attempt " +
             std::to_string(attempt) + "</title></polyline>";
    line.clear();
  };
  for (const auto& p : points) {
    if (p.attempt != attempt) flush(), attempt = p.attempt;
    line += fmt::format("{:.1f},{:.1f} ", axis.x(p.t), y(p.step));
  }
  flush();
  if (!points.empty()) {
    const auto& last = points.back();
    out += fmt::format("<text class=\"stepnote\" x=\"{:.1f}\" y=\"{:.1f}\">{}</text>",
                       std::min(axis.x(last.t) + 4, kWidth - 60), std::max(y(last.step) + 4, 12.0),
                       last.step);
  }
  return out;
}

std::string marks_for(const RunHistory& run, int rank, const TimeAxis& axis) {
  const double bottom = kRowHeight - kBottom;
  std::string out;
  for (const auto& m : run.marks) {
    const double x = axis.x(m.t);
    if (m.kind == "restart") {
      out += fmt::format("<line class=\"restart\" x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"0\" y2=\"{1}\">{2}</line>",
                         x, kRowHeight, title("restart: " + m.text));
      continue;
    }
    if (!has(m.ranks, rank)) continue;
    const std::string tip = title(m.kind + ": " + m.text);
    if (m.kind == "worker_exit") {
      out += fmt::format("<path class=\"exit\" d=\"M{0:.1f} {1:.1f}l6 6m0 -6l-6 6\">{2}</path>",
                         x - 3, bottom - 3, tip);
    } else if (m.kind == "rank_recovered") {
      out += fmt::format("<circle class=\"recovered\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\">{}</circle>", x,
                         bottom, tip);
    } else if (m.kind == "rank_failed" || m.kind == "recovery_fallback") {
      out += fmt::format("<circle class=\"failed\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\">{}</circle>", x,
                         bottom, tip);
    }
  }
  for (const auto& h : run.hangs) {
    const bool culprit = h.culprit == rank;
    if (!culprit && !has(h.stalled, rank)) continue;
    out += fmt::format(
        "<path class=\"{}\" d=\"M{:.1f} {:.1f}l6 10h-12z\">{}</path>", culprit ? "hang culprit" : "hang stalled",
        axis.x(h.t), bottom - 9,
        title(culprit ? "hang: the culprit. " + h.detail : "hang: stalled. " + h.detail));
  }
  return out;
}

}  // namespace

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::map<int, StepTimes> step_times(const RunHistory& run) {
  std::map<int, StepTimes> out;
  for (const auto& [rank, points] : run.steps) {
    StepTimes st;
    for (size_t i = 1; i < points.size(); ++i) {
      const auto& a = points[i - 1];
      const auto& b = points[i];
      if (a.attempt != b.attempt || b.step <= a.step || b.t <= a.t) continue;
      st.samples.push_back((b.t - a.t) / static_cast<double>(b.step - a.step));
    }
    std::vector<double> sorted = st.samples;
    std::sort(sorted.begin(), sorted.end());
    if (!sorted.empty()) {
      st.min = sorted.front();
      st.max = sorted.back();
      st.p25 = quantile(sorted, 0.25);
      st.median = quantile(sorted, 0.5);
      st.p75 = quantile(sorted, 0.75);
    }
    out[rank] = std::move(st);
  }
  return out;
}

std::vector<int> straggler_ranks(const RunHistory& run, const std::map<int, StepTimes>& times) {
  std::vector<int> out;
  for (const auto& [rank, spans] : run.straggling)
    if (!spans.empty()) out.push_back(rank);
  std::vector<double> medians;
  for (const auto& [rank, t] : times)
    if (!t.samples.empty()) medians.push_back(t.median);
  std::sort(medians.begin(), medians.end());
  const double typical = quantile(medians, 0.5);
  if (medians.size() >= 2 && typical > 0) {
    for (const auto& [rank, t] : times)
      if (!t.samples.empty() && t.median > typical / (1 - kStragglerFraction) && !has(out, rank))
        out.push_back(rank);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string timeline_svg(const RunHistory& run, int rank, int64_t max_step) {
  const TimeAxis axis{run.duration};
  std::string svg = fmt::format(
      "<svg class=\"timeline-chart\" viewBox=\"0 0 {} {}\" role=\"img\" "
      "aria-label=\"rank {} timeline\">",
      kWidth, kRowHeight, rank);
  svg += fmt::format("<rect class=\"plot\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>", kLeft,
                     kTop, kWidth - kLeft - kRight, kRowHeight - kTop - kBottom);
  if (auto it = run.straggling.find(rank); it != run.straggling.end()) {
    for (const auto& [from, to] : it->second)
      svg += fmt::format("<rect class=\"straggling\" x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\">{}</rect>",
                         axis.x(from), kTop, std::max(1.0, axis.x(to) - axis.x(from)),
                         kRowHeight - kTop - kBottom, title("straggler"));
  }
  for (const auto& a : run.attempts) {
    svg += fmt::format("<line class=\"attempt\" x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\"/>"
                       "<text class=\"attempt-label\" x=\"{3:.1f}\" y=\"{4}\">attempt {5}</text>",
                       axis.x(a.start), kTop, kRowHeight - kBottom, axis.x(a.start) + 3,
                       kRowHeight - 3, a.attempt);
  }
  if (auto it = run.steps.find(rank); it != run.steps.end())
    svg += step_lines(it->second, axis, max_step);
  svg += marks_for(run, rank, axis);
  return svg + "</svg>";
}

std::string time_axis_svg(double duration) {
  const TimeAxis axis{duration};
  // A round step giving 4 to 10 ticks: 1, 2 or 5 times a power of ten.
  double step = 1;
  if (duration > 0) {
    step = std::pow(10, std::floor(std::log10(duration / 4)));
    for (double m : {1.0, 2.0, 5.0, 10.0})
      if (duration / (step * m) <= 10) {
        step *= m;
        break;
      }
  }
  std::string svg = fmt::format("<svg class=\"time-axis\" viewBox=\"0 0 {} 16\">", kWidth);
  for (double t = 0; t <= duration + 1e-9 && duration > 0; t += step)
    svg += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"0\" y2=\"4\"/>"
                       "<text x=\"{0:.1f}\" y=\"14\">{1:g} s</text>",
                       axis.x(t), t);
  return svg + "</svg>";
}

std::string step_time_svg(const StepTimes& t, double axis_max, bool straggler) {
  constexpr double w = 640, h = 28, pad = 6;
  auto x = [&](double v) { return pad + (w - 2 * pad) * (axis_max > 0 ? v / axis_max : 0); };
  std::string svg = fmt::format("<svg class=\"box-chart{}\" viewBox=\"0 0 {} {}\">",
                                straggler ? " straggler" : "", w, h);
  if (t.samples.empty()) {
    return svg + "<text x=\"6\" y=\"18\" class=\"none\">no two progress events in one attempt yet</text></svg>";
  }
  svg += fmt::format("<line class=\"whisker\" x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"14\" y2=\"14\"/>",
                     x(t.min), x(t.max));
  svg += fmt::format("<rect class=\"box\" x=\"{:.1f}\" y=\"5\" width=\"{:.1f}\" height=\"18\">{}</rect>",
                     x(t.p25), std::max(1.0, x(t.p75) - x(t.p25)),
                     title(fmt::format("25% {:.4g} s, median {:.4g} s, 75% {:.4g} s, {} samples",
                                       t.p25, t.median, t.p75, t.samples.size())));
  svg += fmt::format("<line class=\"median\" x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"3\" y2=\"25\"/>",
                     x(t.median));
  return svg + "</svg>";
}

}  // namespace ddprun::observe
