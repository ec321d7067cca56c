#include "watchdog/timeout_learner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace ddprun::watchdog {

namespace {

using Millis = std::chrono::milliseconds;

// "0.8 s", "41 s", "1,200" style numbers for people.
std::string secs(Millis m) {
  const double s = m.count() / 1000.0;
  return s < 10 ? fmt::format("{:.2g} s", s) : fmt::format("{:.0f} s", s);
}

std::string grouped(uint64_t n) {
  std::string digits = std::to_string(n);
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) digits.insert(i, ",");
  return digits;
}

Millis p99_of(const std::deque<Millis>& recent) {
  if (recent.empty()) return Millis(0);
  std::vector<Millis> v(recent.begin(), recent.end());
  const std::size_t k = std::min(v.size() - 1, static_cast<std::size_t>(
                                                   std::ceil(0.99 * static_cast<double>(v.size()))) -
                                                   1);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

}  // namespace

std::string LearnedTimeout::describe() const {
  const char* unit = kind == TimeoutLearner::kStep ? "gaps between beats"
                     : kind == TimeoutLearner::kSetup ? "starts"
                                                      : "sections";
  if (!learned) {
    return fmt::format("{}: {} (initial; {} {} so far)", kind, secs(timeout), grouped(samples),
                       unit);
  }
  return fmt::format("{}: {}, from {} {}, p99 {}, max {}", kind, secs(timeout), grouped(samples),
                     unit, secs(p99), secs(max));
}

bool TimeoutLearner::add(const std::string& kind, std::chrono::steady_clock::duration sample) {
  const auto ms = std::max(Millis(0), std::chrono::duration_cast<Millis>(sample));
  bool first_fold = false;
  auto it = kinds_.find(kind);
  const bool named = kind != kStep && kind != kSetup;
  if (it == kinds_.end() && named && named_kinds_ >= kMaxNamedKinds) {
    first_fold = !folded_;
    folded_ = true;
    it = kinds_.try_emplace(kOther).first;
  } else if (it == kinds_.end()) {
    it = kinds_.try_emplace(kind).first;
    if (named) ++named_kinds_;
  }
  auto& s = it->second;
  ++s.count;
  s.max = std::max(s.max, ms);
  s.recent.push_back(ms);
  if (s.recent.size() > kWindow) s.recent.pop_front();
  return first_fold;
}

const TimeoutLearner::Samples* TimeoutLearner::samples_of(const std::string& kind) const {
  auto it = kinds_.find(kind);
  if (it == kinds_.end() && folded_ && kind != kStep && kind != kSetup) it = kinds_.find(kOther);
  return it == kinds_.end() ? nullptr : &it->second;
}

Millis TimeoutLearner::timeout_from(const std::string& kind, const Samples* s) const {
  uint64_t samples = 0;
  Millis scaled{0};
  if (s != nullptr) {
    samples = s->count;
    scaled = Millis(static_cast<int64_t>(std::ceil(static_cast<double>(s->max.count()) * options_.factor)));
  }
  const auto learned = std::max(options_.floor, scaled);
  const bool is_learned = samples >= static_cast<uint64_t>(std::max(1, min_samples(kind)));
  // Setup never shrinks below its generous initial value: a restart's setup
  // may load more (a checkpoint) than the first attempt's.
  return is_learned && kind != kSetup ? learned : std::max(initial(kind), learned);
}

Millis TimeoutLearner::initial(const std::string& kind) const {
  if (kind == kStep) return options_.initial_step;
  if (kind == kSetup) return options_.initial_setup;
  return options_.initial_section;
}

int TimeoutLearner::min_samples(const std::string& kind) const {
  return kind == kStep ? options_.min_step_samples : options_.min_section_samples;
}

LearnedTimeout TimeoutLearner::explain(const std::string& kind) const {
  LearnedTimeout t;
  t.kind = kind;
  const Samples* s = samples_of(kind);
  if (s != nullptr) {
    t.samples = s->count;
    t.max = s->max;
    ++quantiles_computed_;
    t.p99 = p99_of(s->recent);
  }
  t.learned = t.samples >= static_cast<uint64_t>(std::max(1, min_samples(kind)));
  t.timeout = timeout_from(kind, s);
  return t;
}

Millis TimeoutLearner::evidence_bound(const std::string& kind) const {
  const Samples* s = samples_of(kind);
  if (kind == kSetup || s == nullptr || s->count < static_cast<uint64_t>(std::max(1, min_samples(kind))))
    return Millis(0);
  const Millis scaled(static_cast<int64_t>(std::ceil(static_cast<double>(s->max.count()) * options_.factor)));
  const Millis bound = std::max(options_.min_evidence_bound, scaled);
  return bound < options_.floor ? bound : Millis(0);
}

Millis TimeoutLearner::timeout(const std::string& kind) const {
  return timeout_from(kind, samples_of(kind));
}

std::vector<LearnedTimeout> TimeoutLearner::all() const {
  std::vector<LearnedTimeout> out{explain(kStep), explain(kSetup)};
  for (const auto& [kind, _] : kinds_) {
    if (kind != kStep && kind != kSetup) out.push_back(explain(kind));
  }
  return out;
}

}  // namespace ddprun::watchdog
