// Watchdog's learned protection (watchdog.h): a rank inside a section or
// still in its setup, here or on another node, holds its peers' progress
// deadlines, since in the usual script they wait for it in the next
// collective.
#include <algorithm>

#include "watchdog/watchdog.h"

namespace ddprun::watchdog {

bool Watchdog::protected_now() const {
  for (const auto& w : workers_) {
    if (w.exited) continue;
    if (!w.sections.empty()) return true;
    if (w.beats == 0 && !w.unwatched) return true;
  }
  // Another node's rank in a section or setup: ranks here wait for it in
  // the next collective as they would for a local one.
  return !peer_guards_.empty();
}

void Watchdog::protection_changed(Clock::time_point now) {
  ++epoch_;
  if (!protected_now()) protection_ended_ = now;
}

bool Watchdog::any_exited() const {
  for (const auto& w : workers_)
    if (w.exited) return true;
  return false;
}

Clock::time_point Watchdog::latest_progress() const {
  Clock::time_point latest{};
  for (const auto& w : workers_)
    if (!w.exited && w.beats > 0) latest = std::max(latest, w.last_beat);
  return latest;
}

std::vector<Guard> Watchdog::guards() const {
  std::vector<Guard> out;
  if (!learning()) return out;
  for (const auto& w : workers_) {
    if (w.exited) continue;
    Guard g;
    g.rank = w.global_rank;
    if (!w.sections.empty()) {
      g.section = w.sections.back().first;  // the innermost is the one judged
      g.until = w.sections.back().second + learner_->timeout(g.section);
    } else if (w.beats == 0 && !w.unwatched) {
      g.section = TimeoutLearner::kSetup;
      g.until = w.spawned + learner_->timeout(TimeoutLearner::kSetup);
    } else {
      continue;
    }
    out.push_back(std::move(g));
  }
  return out;
}

void Watchdog::on_guards_changed(std::function<void(const std::vector<Guard>&)> f) {
  on_guards_changed_ = std::move(f);
  told_guards_ = guards();
  if (on_guards_changed_) on_guards_changed_(told_guards_);
}

void Watchdog::tell_guards() {
  if (!on_guards_changed_) return;
  auto now = guards();
  if (now == told_guards_) return;
  told_guards_ = std::move(now);
  on_guards_changed_(told_guards_);
}

void Watchdog::on_peer_guards(int node, std::vector<Guard> guards) {
  if (!learning() || phase_ == Phase::kStopped) return;
  const auto now = clock_.now();
  const bool was_protected = protected_now();
  guards.erase(std::remove_if(guards.begin(), guards.end(),
                              [&](const Guard& g) { return g.until <= now; }),
               guards.end());
  for (auto& g : guards) g.node = node;
  if (guards.empty()) {
    peer_guards_.erase(node);
  } else {
    peer_guards_[node] = std::move(guards);
  }
  expire_peer_guards(now);
  if (was_protected != protected_now()) protection_changed(now);
  if (phase_ != Phase::kFired) arm_deadline();  // a guard's end is a wake-up (next_due)
}

void Watchdog::expire_peer_guards(Clock::time_point now) {
  const bool was_protected = protected_now();
  for (auto it = peer_guards_.begin(); it != peer_guards_.end();) {
    auto& list = it->second;
    list.erase(std::remove_if(list.begin(), list.end(),
                              [&](const Guard& g) { return g.until <= now; }),
               list.end());
    it = list.empty() ? peer_guards_.erase(it) : std::next(it);
  }
  if (was_protected != protected_now()) protection_changed(now);
}

std::vector<Guard> Watchdog::peer_guards() const {
  std::vector<Guard> out;
  for (const auto& [node, list] : peer_guards_) out.insert(out.end(), list.begin(), list.end());
  return out;
}

}  // namespace ddprun::watchdog
