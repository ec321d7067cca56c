#include "introspect/step_rates.h"

#include <algorithm>

namespace ddprun::introspect {

void StepRates::sample(int rank, Clock::time_point now, int64_t step) {
  auto& s = samples_[rank];
  s.push_back({now, step});
  while (!s.empty() && now - s.front().t > keep_) s.pop_front();
}

void StepRates::forget(int rank) { samples_.erase(rank); }

std::optional<double> StepRates::rate(int rank, std::chrono::milliseconds window,
                                      bool require_full) const {
  auto it = samples_.find(rank);
  if (it == samples_.end() || it->second.size() < 2) return std::nullopt;
  const auto& s = it->second;
  const Sample& last = s.back();
  // The newest sample at least `window` old, else the oldest one.
  const Sample* start = &s.front();
  for (const auto& x : s) {
    if (last.t - x.t >= window) start = &x;
  }
  const auto span = last.t - start->t;
  if (span < std::chrono::seconds(1)) return std::nullopt;
  // Sampling is once a second: "full" allows one missed tick of slack.
  if (require_full && span < window - std::chrono::milliseconds(1500)) return std::nullopt;
  return static_cast<double>(last.step - start->step) / std::chrono::duration<double>(span).count();
}

std::optional<double> StepRates::median_rate(std::chrono::milliseconds window) const {
  std::vector<double> rates;
  for (const auto& [rank, s] : samples_) {
    if (auto r = rate(rank, window, true)) rates.push_back(*r);
  }
  if (rates.size() < 2) return std::nullopt;
  std::sort(rates.begin(), rates.end());
  const std::size_t n = rates.size();
  return n % 2 ? rates[n / 2] : (rates[n / 2 - 1] + rates[n / 2]) / 2;
}

std::vector<int> StepRates::stragglers(const StragglerOptions& o) const {
  std::vector<std::pair<double, int>> slow;
  if (o.fraction <= 0) return {};
  const auto median = median_rate(o.window);
  if (!median || *median <= 0) return {};
  for (const auto& [rank, s] : samples_) {
    const auto r = rate(rank, o.window, true);
    if (r && *r < (1.0 - o.fraction) * *median) slow.emplace_back(*r, rank);
  }
  std::sort(slow.begin(), slow.end());
  std::vector<int> out;
  for (const auto& [r, rank] : slow) out.push_back(rank);
  return out;
}

}  // namespace ddprun::introspect
