#include "watchdog/peer_stall.h"

#include <algorithm>

namespace ddprun::watchdog {

Millis silent_for(const WorkerStatus& w, Clock::time_point now) {
  return std::chrono::duration_cast<Millis>(now - (w.beats > 0 ? w.last_beat : w.spawned));
}

std::vector<int> local_ranks_behind(const std::vector<WorkerStatus>& workers,
                                    const PeerStall& stall, Clock::time_point now) {
  std::vector<const WorkerStatus*> behind;
  for (const auto& w : workers) {
    if (w.exited || w.unwatched || w.beats == 0 || w.step < 0 || w.step >= stall.step) continue;
    if (silent_for(w, now) * 2 < stall.silent) continue;  // still moving: not the one
    behind.push_back(&w);
  }
  std::sort(behind.begin(), behind.end(), [](const auto* a, const auto* b) {
    return a->step != b->step ? a->step < b->step : a->last_beat < b->last_beat;
  });
  std::vector<int> out;
  for (const auto* w : behind) out.push_back(w->local_rank);
  return out;
}

}  // namespace ddprun::watchdog
