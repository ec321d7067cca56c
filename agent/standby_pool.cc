// StandbyPool (standby_pool.h).
#include "agent/standby_pool.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "agent/line_splitter.h"
#include "base/recovery_wire.h"

namespace ddprun::agent {

namespace wire = base::recovery_wire;

void StandbyPool::refill(int restarts_left, int generation) {
  if (restarts_left <= 0) {
    // Said once, at the attempt's start: a standby would only ever wait.
    if (options_.standby_workers > 0 && started_ == 0 && generation == 0)
      spdlog::warn("--standby-workers={}: no standby started, no restart is left for a "
                   "replacement (--max-restarts={})",
                   options_.standby_workers, options_.max_restarts);
    return;
  }
  const int lost_budget = options_.max_restarts + options_.standby_workers;
  int alive = 0;
  for (const auto& s : standbys_) alive += s.alive ? 1 : 0;
  while (alive < options_.standby_workers && lost_ < lost_budget) {
    const int number = ++started_;
    std::optional<SpawnError> error;
    try {
      standbys_.push_back(spawner_.spawn_standby(number));
      error = spawner_.finish_exec(standbys_.back());
    } catch (const SpawnError& e) {
      error = e;
    }
    if (error) {
      // Not the job's failure: a replacement is then spawned as without one.
      spdlog::warn("cannot start standby {}: {}; a failed rank is replaced by a process "
                   "started then",
                   number, error->what());
      return;
    }
    ++alive;
    spdlog::debug("standby {} started (pid {})", number, standbys_.back().info.pid);
  }
}

std::optional<WorkerProcess> StandbyPool::assign(int lr, int rank, int generation) {
  wire::Message m;
  m.event = wire::Event::kAssign;
  m.generation = generation;
  m.rank = rank;
  m.local_rank = lr;
  auto it = standbys_.begin();
  for (; it != standbys_.end(); ++it) {
    if (!it->alive || !it->channel || !it->channel->is_open()) continue;
    if (it->channel->send(wire::format(m))) break;
    // Its end is gone (it is dying) or full (it never reads): not a
    // standby to count on, now or at a later failure (its channel closed),
    // but the next one may be. Its exit is reported as a standby's.
    spdlog::warn("standby {} (pid {}) cannot be told its rank; it is killed", it->standby,
                 it->info.pid);
    launcher_.signal_group(it->info.pid, SIGKILL);
    it->channel->close();
  }
  if (it == standbys_.end()) return std::nullopt;
  WorkerProcess s = std::move(*it);
  standbys_.erase(it);
  s.info.local_rank = lr;
  s.info.rank = rank;
  *s.slot = lr;
  s.prefix = make_line_prefix(options_.log_line_prefix_template, options_.role, rank, lr,
                              options_.hostname);
  for (auto* pump : {s.out.get(), s.err.get()})
    if (pump) pump->set_prefix(s.prefix);
  spdlog::info("standby {} (pid {}) takes rank {}'s slot (local rank {}), generation {}",
               s.standby, s.info.pid, rank, lr, generation);
  return s;
}

bool StandbyPool::on_exit(pid_t pid, int wait_status, bool running, int restarts_left,
                          bool recovering) {
  auto it = std::find_if(standbys_.begin(), standbys_.end(),
                         [pid](const WorkerProcess& s) { return s.info.pid == pid; });
  if (it == standbys_.end() || !it->alive) return false;
  it->alive = false;
  // What it started goes with it.
  launcher_.signal_group(pid, SIGKILL);
  if (it->channel) it->channel->close();
  const int number = it->standby;
  if (running && !stopping_) {
    ++lost_;
    const bool another =
        restarts_left > 0 && lost_ < options_.max_restarts + options_.standby_workers;
    spdlog::warn("standby {} (pid {}) ended with {} before it was assigned a rank; not a job "
                 "failure; {}",
                 number, pid, ExitStatus::from_wait(wait_status).describe(),
                 !another    ? "no other standby is started (no restart left, or too many lost)"
                 : recovering ? "another starts once the recovery is over"
                              : "starting another");
    // During a recovery the next one starts when it is over.
    if (another && !recovering) refill(restarts_left, 1);
  }
  return true;
}

bool StandbyPool::end() {
  bool left = false;
  for (auto& s : standbys_) {
    if (!s.alive) continue;
    left = true;
    if (!stopping_) launcher_.signal_group(s.info.pid, SIGKILL);
  }
  if (left) stopping_ = true;
  return left;
}

void StandbyPool::forget() {
  for (auto& s : standbys_) s.alive = false;
}

}  // namespace ddprun::agent
