// Watchdog's blame (watchdog.h): the ranks past a deadline, the laggard
// rule's suspects, the one culprit named first everywhere, and a hang
// blamed from another node (peer_stall.h).
#include <algorithm>

#include "watchdog/watchdog.h"

namespace ddprun::watchdog {

namespace {

// The furthest step of the workers `judged`, -1 when none reported one.
template <class Judged>
int64_t furthest_step(const std::vector<WorkerStatus>& workers, const Judged& judged) {
  int64_t furthest = -1;
  for (const auto& w : workers)
    if (judged(w)) furthest = std::max(furthest, w.step);
  return furthest;
}

}  // namespace

void Watchdog::blame(int local_rank, int peer_node, std::string detail) {
  if (disarmed()) return;
  const WorkerStatus* w = find_local(local_rank);
  if (w == nullptr || w->exited) return;
  const auto now = clock_.now();
  HangEvent e = HangEvent::about(*w, HangKind::kHeartbeat, Millis(0), now, now, std::move(detail));
  e.peer_node = peer_node;
  fire(std::move(e));
}

std::vector<int> Watchdog::stalled_ranks(const HangEvent& event) const {
  std::vector<int> out{event.global_rank};
  for (const auto& w : workers_) {
    if (w.global_rank == event.global_rank || w.exited) continue;
    bool overdue = false;
    if (auto d = heartbeat_due(w); d && *d <= event.detected) overdue = true;
    if (auto d = silence_due(w); d && *d <= event.detected) overdue = true;
    if (w.stuck_since) overdue = true;
    if (overdue) out.push_back(w.global_rank);
  }
  return out;
}

int Watchdog::culprit(const HangEvent& event) const {
  // Only a missed beat is judged by comparing ranks; the other kinds are
  // about the rank's own state (a section, its output, its process state).
  if (event.kind != HangKind::kHeartbeat) return event.global_rank;
  auto judged = [this](const WorkerStatus& w) { return judged_by_beats(w); };
  const int64_t furthest = furthest_step(workers_, judged);
  const WorkerStatus* behind = nullptr;
  for (const auto& w : workers_)
    if (judged(w) && furthest >= 0 && w.step < furthest && (!behind || w.step < behind->step))
      behind = &w;
  if (behind) return behind->global_rank;
  // Same step everywhere: a live rank that never beat held the others up;
  // else the one whose last progress is oldest stopped first.
  const WorkerStatus* oldest = nullptr;
  for (const auto& w : workers_) {
    if (!judged(w)) continue;
    if (w.beats == 0) return w.global_rank;
    if (!oldest || w.last_beat < oldest->last_beat) oldest = &w;
  }
  return oldest ? oldest->global_rank : event.global_rank;
}

std::vector<int> Watchdog::suspects(const HangEvent& event) const {
  auto judged = [this](const WorkerStatus& w) { return judged_by_beats(w); };
  const int64_t furthest = furthest_step(workers_, judged);
  std::vector<const WorkerStatus*> behind;
  for (const auto& w : workers_) {
    if (judged(w) && furthest >= 0 && w.step < furthest) behind.push_back(&w);
  }
  if (behind.empty()) return stalled_ranks(event);
  std::sort(behind.begin(), behind.end(),
            [](const auto* a, const auto* b) { return a->step < b->step; });
  std::vector<int> out;
  for (const auto* w : behind) out.push_back(w->global_rank);
  return out;
}

}  // namespace ddprun::watchdog
