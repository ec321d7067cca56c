#include "base/clock.h"

namespace ddprun::base {

class ManualClock::ManualTimer : public Timer {
 public:
  explicit ManualTimer(ManualClock* clock) : clock_(clock) { clock_->timers_.insert(this); }
  ~ManualTimer() override {
    if (clock_) clock_->timers_.erase(this);
  }
  void arm(TimePoint when, std::function<void()> fire) override {
    when_ = when;
    fire_ = std::move(fire);
    seq_ = clock_ ? clock_->next_seq_++ : 0;
  }
  void cancel() override { fire_ = nullptr; }
  bool armed() const override { return static_cast<bool>(fire_); }

  TimePoint when_{};
  uint64_t seq_ = 0;
  std::function<void()> fire_;
  ManualClock* clock_;
};

ManualClock::ManualClock() : now_(TimePoint{} + std::chrono::hours(1000)) {}

ManualClock::~ManualClock() {
  // Timers outliving their clock stay inert rather than touch it.
  for (auto* t : timers_) t->clock_ = nullptr;
}

std::unique_ptr<Timer> ManualClock::make_timer() { return std::make_unique<ManualTimer>(this); }

ManualClock::ManualTimer* ManualClock::earliest() const {
  ManualTimer* best = nullptr;
  for (auto* t : timers_) {
    if (!t->armed()) continue;
    if (!best || t->when_ < best->when_ || (t->when_ == best->when_ && t->seq_ < best->seq_))
      best = t;
  }
  return best;
}

void ManualClock::fire_due(TimePoint until, bool late) {
  // One at a time, searching afresh: a callback may arm, cancel or destroy
  // any timer, itself included.
  while (ManualTimer* t = earliest()) {
    if (t->when_ > until) break;
    if (!late && t->when_ > now_) now_ = t->when_;
    auto fire = std::move(t->fire_);
    t->fire_ = nullptr;
    fire();
  }
}

void ManualClock::advance(Duration d) {
  const TimePoint until = now_ + d;
  fire_due(until, false);
  now_ = until;
}

void ManualClock::jump(Duration d) {
  now_ += d;
  fire_due(now_, true);
}

bool ManualClock::advance_to_next() {
  ManualTimer* t = earliest();
  if (!t) return false;
  advance(t->when_ > now_ ? t->when_ - now_ : Duration::zero());
  return true;
}

int ManualClock::armed_timers() const {
  int n = 0;
  for (auto* t : timers_)
    if (t->armed()) ++n;
  return n;
}

}  // namespace ddprun::base
