// Attempt (attempt.h) with --restart-scope=rank: replacing one failed or
// hung rank while the others keep running (docs/RECOVERY.md).
//
// One recovery at a time. It begins when a worker fails in the running
// phase (or a hook blames a hung one) with a restart left: the generation
// goes up, the survivors get `failed` at once (they may be waiting on the
// dead rank in a collective), the slot's process group is SIGKILLed (what
// it started dies with it), the replacement starts in the same slot with
// the same ranks and DDPRUN_GENERATION=G, and the survivors get `ready`.
// It ends when every local rank has sent `joined` for G; then every rank
// gets `recovered`. Anything that makes that impossible (a second failure,
// no restart left, the spawn failing, --recovery-timeout) falls back to
// the group teardown, which the workers hear of as `fallback`.
//
// A hang (recover_hang) differs only in its start: the culprit may first
// get its traceback signal, for up to the hook's wait, then SIGKILL; its
// reaped end (Worker::replacing) starts the replacement.
#include <fmt/format.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "base/duration.h"
#include "agent/attempt.h"
#include "agent/spawn.h"
#include "base/recovery_wire.h"

namespace ddprun::agent {
namespace {

namespace wire = base::recovery_wire;

}  // namespace

int Attempt::restarts_left() const {
  return options_.max_restarts - setup_.restart_count - rank_restarts_;
}

void Attempt::tell_workers(const std::string& packet, int except) {
  for (auto& w : workers_) {
    if (!w.alive || !w.channel || w.info.local_rank == except) continue;
    // A full socket drops it: a worker that never reads costs nothing.
    if (!w.channel->send(packet))
      spdlog::debug("recovery channel of rank {}: '{}' not delivered", w.info.rank, packet);
  }
}

void Attempt::recovery_hooks(RecoveryEvent event) {
  event.restarts_left = std::max(0, restarts_left());
  for (auto* h : hooks_) h->recovery(event);
}

bool Attempt::recover_exit(Worker& w, const WorkerEnd& end) {
  if (!rank_scope()) return false;
  const int lr = w.info.local_rank;
  if (w.replacing) {
    // The hung rank we SIGKILLed (or that ended on its traceback signal).
    victim_timer_->cancel();
    respawn(lr);
    return true;
  }
  const std::string what = worker_name(w.info) + " failed with " + end.status.describe();
  if (recovery_) {
    fall_back("second_failure", what + " during the recovery of generation " +
                                    std::to_string(recovery_->generation));
    return false;
  }
  const auto& codes = options_.no_restart_exit_codes;
  if (!end.status.signaled && std::count(codes.begin(), codes.end(), end.status.code)) {
    // --no-restart-exit-codes: a replacement would fail the same way; the
    // restart policy says why the job ends.
    fall_back("no_restart_exit_code", what + ", listed in --no-restart-exit-codes");
    return false;
  }
  if (restarts_left() <= 0) {
    fall_back("no_restart_left",
              what + " and no restart is left (--max-restarts=" +
                  std::to_string(options_.max_restarts) + ")");
    return false;
  }
  Failure f;
  f.local_rank = lr;
  f.status = end.status;
  f.exit_code = end.status.shell_code();
  f.when = end.when;
  begin_recovery(lr, std::string(wire::kCauseExit), what, std::move(f));
  respawn(lr);
  return true;
}

bool Attempt::recover_hang(const FailRequest& req) {
  if (!rank_scope()) return false;
  const int lr = *req.replace_local_rank;
  if (lr < 0 || lr >= static_cast<int>(workers_.size()) || !workers_[lr].alive) return false;
  Worker& w = workers_[lr];
  const std::string what = worker_name(w.info) + " hung";
  if (recovery_) {
    fall_back("second_failure", what + " during the recovery of generation " +
                                    std::to_string(recovery_->generation));
    return false;
  }
  if (restarts_left() <= 0) {
    fall_back("no_restart_left", what + " and no restart is left (--max-restarts=" +
                                     std::to_string(options_.max_restarts) + ")");
    return false;
  }
  Failure f;
  f.reason = req.reason;
  f.local_rank = lr;
  f.exit_code = req.exit_code;
  f.when = clock_.now();
  begin_recovery(lr, std::string(wire::kCauseHang), what, std::move(f));
  w.replacing = true;
  // Its traceback first where the hook asked for one (SIGABRT to a Python
  // worker with faulthandler), bounded by req.wait; then SIGKILL. A
  // stopped process holds the signal until continued.
  const bool traceback =
      req.signal != 0 && std::count(req.targets.begin(), req.targets.end(), lr) > 0;
  const pid_t pid = w.info.pid;
  if (traceback) {
    launcher_.signal(pid, req.signal);
    launcher_.signal_group(pid, SIGCONT);
    const int generation = generation_;
    victim_timer_->arm(clock_.now() + req.wait, [this, lr, pid, generation] {
      if (phase_ == Phase::kRunning && recovery_ && recovery_->generation == generation &&
          workers_[lr].alive && workers_[lr].info.pid == pid)
        launcher_.signal_group(pid, SIGKILL);
    });
  } else {
    launcher_.signal_group(pid, SIGKILL);
  }
  return true;
}

void Attempt::begin_recovery(int lr, const std::string& cause, const std::string& what,
                             Failure failure) {
  ++generation_;
  ++rank_restarts_;
  Recovery r;
  r.generation = generation_;
  r.local_rank = lr;
  r.ranks = {workers_[lr].info.rank};
  r.cause = cause;
  r.began = clock_.now();
  r.failure = std::move(failure);
  recovery_ = std::move(r);
  const std::string line =
      what + "; replacing only that rank, generation " + std::to_string(generation_) +
      " (--restart-scope=rank; " + std::to_string(std::max(0, restarts_left())) + " of " +
      std::to_string(options_.max_restarts) + " restarts left)";
  spdlog::warn("{}", line);
  announce_failure(recovery_->ranks, lr, line);
  if (peers_) {
    // The other nodes' survivors hear of it through the store.
    rendezvous::RankFailure f;
    f.generation = generation_;
    f.ranks = recovery_->ranks;
    f.cause = cause == wire::kCauseHang ? rendezvous::RankFailure::kHang
                                        : rendezvous::RankFailure::kExit;
    f.node = setup_.round.node_id;
    peers_->open_generation(f);
  }
}

void Attempt::announce_failure(const std::vector<int>& ranks, int except,
                               const std::string& line) {
  // At once, before the replacement exists: a survivor may be waiting on
  // the failed rank (or on another survivor) in a collective.
  wire::Message m;
  m.event = std::string(wire::kEventFailed);
  m.generation = generation_;
  m.ranks = ranks;
  m.cause = recovery_->cause;
  tell_workers(wire::format(m), except);
  RecoveryEvent e;
  e.kind = RecoveryEvent::Kind::kFailed;
  e.generation = generation_;
  e.ranks = ranks;
  e.cause = recovery_->cause;
  e.detail = line;
  recovery_hooks(std::move(e));
  const int generation = generation_;
  recovery_timer_->arm(
      clock_.now() + base::millis_from_seconds(options_.recovery_timeout_s), [this, generation] {
        if (phase_ != Phase::kRunning || !recovery_ || recovery_->generation != generation) return;
        std::string missing;
        for (const auto& w : workers_)
          if (w.alive && !recovery_->joined.count(w.info.local_rank))
            missing += (missing.empty() ? "" : ",") + std::to_string(w.info.rank);
        const std::string not_joined =
            recovery_->joined_here ? "every rank here joined, another node's did not"
                                   : "not joined: rank " + (missing.empty() ? "-" : missing);
        const std::string why = "generation " + std::to_string(generation) +
                                " did not form within --recovery-timeout=" +
                                fmt::format("{:g}", options_.recovery_timeout_s) + " s (" +
                                not_joined + ")";
        Failure f;
        f.reason = "rank-scoped recovery failed: " + why;
        f.exit_code = 1;
        f.when = clock_.now();
        give_up("timeout", why, std::move(f));
      });
}

void Attempt::give_up(const std::string& reason, const std::string& why, Failure root) {
  fall_back(reason, why);
  record_failure(std::move(root));
  begin_teardown(SIGTERM);
}

void Attempt::respawn(int lr) {
  Worker& old = workers_[lr];
  // The rest of its process group (a data loader, a shell's child) goes
  // with it before anything takes its place.
  if (!old.never_ran) launcher_.signal_group(old.info.pid, SIGKILL);
  launcher_.release(old.info.pid);
  if (old.channel) old.channel->close();
  const WorkerInfo old_info = old.info;
  // --standby-workers: a process that is already initialised takes the
  // slot, rather than one that starts now (attempt_standby.cc).
  if (assign_standby(lr, old_info)) return;
  std::optional<SpawnError> error;
  try {
    Worker fresh = spawn_worker(lr, SpawnKind::kReplacement);
    std::swap(workers_[lr], fresh);
    // The replaced worker's pumps drain to EOF; finish() closes them.
    retired_.push_back(std::move(fresh));
  } catch (const SpawnError& e) {
    error = e;
  }
  Worker& w = workers_[lr];
  if (!error) {
    info_.workers[lr] = w.info;
    error = finish_exec(w);
  }
  if (error) {
    spdlog::error("cannot start the replacement for rank {}: {}", old_info.rank, error->what());
    give_up("spawn_failed", std::string("the replacement could not start: ") + error->what(),
            recovery_->failure);
    return;
  }
  replaced(lr, old_info);
}

void Attempt::replaced(int lr, const WorkerInfo& old) {
  const Worker& w = workers_[lr];
  recovery_->spawned = true;
  RecoveryEvent e;
  e.kind = RecoveryEvent::Kind::kReplaced;
  e.generation = generation_;
  e.ranks = {w.info.rank};
  e.cause = recovery_->cause;
  e.replacement = w.info;
  e.replaced = old;
  e.standby = w.standby;
  e.detail = "rank " + std::to_string(w.info.rank) + " replaced: pid " +
             std::to_string(old.pid) + " -> " + std::to_string(w.info.pid) +
             (w.standby ? " (standby " + std::to_string(w.standby) + ")" : std::string()) +
             ", generation " + std::to_string(generation_);
  recovery_hooks(std::move(e));
  wire::Message m;
  m.event = std::string(wire::kEventReady);
  m.generation = generation_;
  m.ranks = {w.info.rank};
  tell_workers(wire::format(m), lr);
}

void Attempt::on_packet(int lr, std::string_view packet) {
  const auto m = wire::parse(packet);
  if (!m) {
    spdlog::debug("recovery channel of local rank {}: malformed packet ignored", lr);
    return;
  }
  if (m->event != wire::kEventJoined) return;  // nothing else is the worker's to send
  if (phase_ != Phase::kRunning || !recovery_ || m->generation != recovery_->generation) {
    spdlog::debug("recovery channel of local rank {}: joined generation {} ignored (current {})",
                  lr, m->generation, generation_);
    return;
  }
  recovery_->joined.insert(lr);
  check_joined();
}

void Attempt::check_joined() {
  if (!recovery_ || !recovery_->spawned) return;
  // A rank that ended since (successfully: a failure falls back) has no
  // generation to join.
  for (const auto& w : workers_)
    if (w.alive && !recovery_->joined.count(w.info.local_rank)) return;
  if (peers_) {
    // Over once every node's ranks are in (generation_formed).
    if (!recovery_->joined_here) peers_->joined(recovery_->generation);
    recovery_->joined_here = true;
    return;
  }
  recovery_complete();
}

void Attempt::recovery_complete() {
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(clock_.now() -
                                                                          recovery_->began);
  const std::string line =
      fmt::format("generation {} formed: every rank joined {} ms after rank {} failed",
                  recovery_->generation, took.count(), fmt::join(recovery_->ranks, ","));
  spdlog::info("{}", line);
  RecoveryEvent e;
  e.kind = RecoveryEvent::Kind::kJoined;
  e.generation = recovery_->generation;
  e.ranks = recovery_->ranks;
  e.cause = recovery_->cause;
  e.detail = line;
  recovery_timer_->cancel();
  wire::Message m;
  m.event = std::string(wire::kEventRecovered);
  m.generation = recovery_->generation;
  m.ranks = recovery_->ranks;
  recovery_.reset();
  // To every rank, the replacement too: from here a failure is a new one.
  tell_workers(wire::format(m));
  recovery_hooks(std::move(e));
  // The next failure finds a standby too; started only now, so that its
  // start-up (LibTorch, the model) takes no CPU from the recovery.
  start_standbys();
}

void Attempt::fall_back(const std::string& reason, const std::string& why) {
  victim_timer_->cancel();
  recovery_timer_->cancel();
  const int generation = recovery_ ? recovery_->generation : generation_;
  recovery_.reset();
  const std::string line = "rank-scoped recovery gives up (" + reason + "): " + why +
                           "; the whole group stops (and restarts, --max-restarts permitting)";
  spdlog::warn("{}", line);
  wire::Message m;
  m.event = std::string(wire::kEventFallback);
  m.reason = reason;
  tell_workers(wire::format(m));
  RecoveryEvent e;
  e.kind = RecoveryEvent::Kind::kFallback;
  e.generation = generation;
  e.reason = reason;
  e.detail = line;
  recovery_hooks(std::move(e));
}

}  // namespace ddprun::agent
