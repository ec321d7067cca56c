// Attempt (attempt.h) with --standby-workers (rank scope only,
// docs/RECOVERY.md): pre-started workers without a rank that take a failed
// rank's slot.
//
// A replacement started at the failure spends its start-up (a LibTorch
// program: loading the library, building the model) while the survivors
// wait; a standby has done that before. It starts with the group (after
// it: its start-up competes with theirs for nothing that matters), gets a
// recovery channel and DDPRUN_STANDBY=<n> but no RANK or LOCAL_RANK, and
// waits on its channel. At a failure, once the failed rank's group is
// SIGKILLed, the standby gets `event=assign` (rank, local rank, generation)
// and from then on is that slot's worker: the survivors' `ready`, its
// `joined`, the watchdog's watching, its console prefix. Another standby
// starts when the recovery is over, not during it.
//
// A standby is nobody's rank: no heartbeat deadline, no hooks' output or
// exit before it is assigned; its death before assignment is one console
// line, and another starts while a recovery could still use one (a restart
// left) and fewer than --max-restarts + --standby-workers were lost (a
// standby that always dies must not loop). When every rank has ended the
// standbys are SIGKILLed: they hold no state.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "agent/attempt.h"
#include "agent/line_splitter.h"
#include "agent/spawn.h"
#include "base/recovery_wire.h"

namespace ddprun::agent {

namespace wire = base::recovery_wire;

void Attempt::start_standbys() {
  if (!rank_scope() || phase_ != Phase::kRunning) return;
  if (restarts_left() <= 0) {
    // Said once, at the attempt's start: a standby would only ever wait.
    if (options_.standby_workers > 0 && standbys_started_ == 0 && generation_ == 0)
      spdlog::warn("--standby-workers={}: no standby started, no restart is left for a "
                   "replacement (--max-restarts={})",
                   options_.standby_workers, options_.max_restarts);
    return;
  }
  const int lost_budget = options_.max_restarts + options_.standby_workers;
  int alive = 0;
  for (const auto& s : standbys_) alive += s.alive ? 1 : 0;
  while (alive < options_.standby_workers && standbys_lost_ < lost_budget) {
    const int number = ++standbys_started_;
    std::optional<SpawnError> error;
    try {
      standbys_.push_back(spawn_worker(number, SpawnKind::kStandby));
      error = finish_exec(standbys_.back());
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

bool Attempt::assign_standby(int lr, const WorkerInfo& old) {
  auto it = std::find_if(standbys_.begin(), standbys_.end(), [](const Worker& s) {
    return s.alive && s.channel && s.channel->is_open();
  });
  if (it == standbys_.end()) return false;
  const WorkerInfo& slot = info_.workers[lr];
  wire::Message m;
  m.event = std::string(wire::kEventAssign);
  m.generation = generation_;
  m.rank = slot.rank;
  m.local_rank = lr;
  if (!it->channel->send(wire::format(m))) {
    // Its end is gone (it is dying) or full (it never reads): not a
    // standby to count on. Its exit, if any, is reported as a standby's.
    spdlog::warn("standby {} (pid {}) cannot be told its rank; a replacement is started instead",
                 it->standby, it->info.pid);
    launcher_.signal_group(it->info.pid, SIGKILL);
    return false;
  }
  Worker s = std::move(*it);
  standbys_.erase(it);
  s.info.local_rank = lr;
  s.info.rank = slot.rank;
  *s.slot = lr;
  s.prefix = make_line_prefix(options_.log_line_prefix_template, options_.role, s.info.rank, lr,
                              options_.hostname);
  for (auto* pump : {s.out.get(), s.err.get()})
    if (pump) pump->set_prefix(s.prefix);
  spdlog::info("standby {} (pid {}) takes rank {}'s slot (local rank {}), generation {}",
               s.standby, s.info.pid, s.info.rank, lr, generation_);
  std::swap(workers_[lr], s);
  // The replaced worker's pumps drain to EOF; finish() closes them.
  retired_.push_back(std::move(s));
  info_.workers[lr] = workers_[lr].info;
  recovery_->from_standby = true;
  replaced(lr, old);
  return true;
}

bool Attempt::standby_exited(pid_t pid, int wait_status) {
  auto it = std::find_if(standbys_.begin(), standbys_.end(),
                         [pid](const Worker& s) { return s.info.pid == pid; });
  if (it == standbys_.end() || !it->alive) return false;
  it->alive = false;
  // What it started goes with it.
  launcher_.signal_group(pid, SIGKILL);
  if (it->channel) it->channel->close();
  const int number = it->standby;
  if (phase_ == Phase::kRunning && !standbys_stopping_) {
    ++standbys_lost_;
    const bool another = restarts_left() > 0 &&
                         standbys_lost_ < options_.max_restarts + options_.standby_workers;
    spdlog::warn("standby {} (pid {}) ended with {} before it was assigned a rank; not a job "
                 "failure; {}",
                 number, pid, ExitStatus::from_wait(wait_status).describe(),
                 !another ? "no other standby is started (no restart left, or too many lost)"
                 : recovery_ ? "another starts once the recovery is over"
                             : "starting another");
    // During a recovery the next one starts when it is over (check_joined).
    if (another && !recovery_) start_standbys();
  }
  check_progress();
  return true;
}

bool Attempt::standbys_left() {
  bool left = false;
  for (auto& s : standbys_) {
    if (!s.alive) continue;
    left = true;
    if (!standbys_stopping_) launcher_.signal_group(s.info.pid, SIGKILL);
  }
  if (left) standbys_stopping_ = true;
  return left;
}

}  // namespace ddprun::agent
