// RankRecovery (rank_recovery.h): one rank replaced while the others run.
#include "agent/rank_recovery.h"

#include <fmt/format.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "base/duration.h"
#include "base/recovery_wire.h"

namespace ddprun::agent {
namespace {

namespace wire = base::recovery_wire;

}  // namespace

RankRecovery::RankRecovery(RecoveryHost& host, base::Clock& clock, const Options& options,
                           RecoveryPlace place, std::vector<AgentHooks*> hooks,
                           boost::asio::io_context& io)
    : host_(host),
      clock_(clock),
      options_(options),
      place_(std::move(place)),
      hooks_(std::move(hooks)),
      io_(io),
      rank_restarts_(place_.rank_restarts),
      recovery_timer_(clock.make_timer()),
      victim_timer_(clock.make_timer()) {}

int RankRecovery::restarts_left() const {
  return options_.max_restarts - place_.restart_count - rank_restarts_;
}

void RankRecovery::start() { start_peers(); }

void RankRecovery::stop() {
  recovery_timer_->cancel();
  victim_timer_->cancel();
  if (peers_) peers_->stop();
}

void RankRecovery::hooks(RecoveryEvent event) {
  event.restarts_left = std::max(0, restarts_left());
  for (auto* h : hooks_) h->recovery(event);
}

bool RankRecovery::on_exit(const WorkerEnd& end) {
  if (!enabled()) return false;
  const int lr = end.worker.local_rank;
  if (recovery_ && recovery_->victim != 0 && recovery_->victim == end.worker.pid) {
    // The hung rank we SIGKILLed (or that ended on its traceback signal).
    victim_timer_->cancel();
    recovery_->victim = 0;
    respawn(lr);
    return true;
  }
  if (end.status.success()) return false;
  const std::string what = worker_name(end.worker) + " failed with " + end.status.describe();
  if (recovery_) {
    fall_back(wire::Fallback::kSecondFailure, what + " during the recovery of generation " +
                                    std::to_string(recovery_->generation));
    return false;
  }
  const auto& codes = options_.no_restart_exit_codes;
  if (!end.status.signaled && std::count(codes.begin(), codes.end(), end.status.code)) {
    // --no-restart-exit-codes: a replacement would fail the same way; the
    // restart policy says why the job ends.
    fall_back(wire::Fallback::kNoRestartExitCode, what + ", listed in --no-restart-exit-codes");
    return false;
  }
  if (restarts_left() <= 0) {
    fall_back(wire::Fallback::kNoRestartLeft,
              what + " and no restart is left (--max-restarts=" +
                  std::to_string(options_.max_restarts) + ")");
    return false;
  }
  Failure f;
  f.local_rank = lr;
  f.status = end.status;
  f.exit_code = end.status.shell_code();
  f.when = end.when;
  begin(lr, wire::Cause::kExit, what, std::move(f));
  respawn(lr);
  return true;
}

bool RankRecovery::on_hang(const FailRequest& req) {
  if (!enabled()) return false;
  const int lr = *req.replace_local_rank;
  if (lr < 0 || lr >= host_.slot_count() || !host_.slot_alive(lr)) return false;
  const WorkerInfo& w = host_.slot(lr);
  const std::string what = worker_name(w) + " hung";
  if (recovery_) {
    fall_back(wire::Fallback::kSecondFailure, what + " during the recovery of generation " +
                                    std::to_string(recovery_->generation));
    return false;
  }
  if (restarts_left() <= 0) {
    fall_back(wire::Fallback::kNoRestartLeft, what + " and no restart is left (--max-restarts=" +
                                     std::to_string(options_.max_restarts) + ")");
    return false;
  }
  Failure f;
  f.reason = req.reason;
  f.local_rank = lr;
  f.exit_code = req.exit_code;
  f.when = clock_.now();
  const pid_t pid = w.pid;
  begin(lr, wire::Cause::kHang, what, std::move(f));
  recovery_->victim = pid;
  // Its traceback first where the hook asked for one (SIGABRT to a Python
  // worker with faulthandler), bounded by req.wait; then SIGKILL. A
  // stopped process holds the signal until continued.
  const bool traceback =
      req.signal != 0 && std::count(req.targets.begin(), req.targets.end(), lr) > 0;
  if (!traceback) {
    host_.signal_slot(lr, SIGKILL, true);
    return true;
  }
  host_.signal_slot(lr, req.signal, false);
  host_.signal_slot(lr, SIGCONT, true);
  const int generation = generation_;
  victim_timer_->arm(clock_.now() + req.wait, [this, lr, pid, generation] {
    if (host_.running() && recovery_ && recovery_->generation == generation &&
        host_.slot_alive(lr) && host_.slot(lr).pid == pid)
      host_.signal_slot(lr, SIGKILL, true);
  });
  return true;
}

void RankRecovery::begin(int lr, wire::Cause cause, const std::string& what,
                         Failure failure) {
  ++generation_;
  ++rank_restarts_;
  Recovery r;
  r.generation = generation_;
  r.local_rank = lr;
  r.ranks = {host_.slot(lr).rank};
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
    f.cause = cause == wire::Cause::kHang ? rendezvous::RankFailure::kHang
                                        : rendezvous::RankFailure::kExit;
    f.node = place_.round.node_id;
    peers_->open_generation(f);
  }
}

void RankRecovery::announce_failure(const std::vector<int>& ranks, int except,
                                    const std::string& line) {
  // At once, before the replacement exists: a survivor may be waiting on
  // the failed rank (or on another survivor) in a collective.
  wire::Message m;
  m.event = wire::Event::kFailed;
  m.generation = generation_;
  m.ranks = ranks;
  m.cause = recovery_->cause;
  host_.tell_workers(wire::format(m), except);
  RecoveryEvent e;
  e.kind = RecoveryEvent::Kind::kFailed;
  e.generation = generation_;
  e.ranks = ranks;
  e.cause = std::string(wire::name(recovery_->cause));
  e.detail = line;
  hooks(std::move(e));
  const int generation = generation_;
  recovery_timer_->arm(clock_.now() + options_.recovery_timeout,
                       [this, generation] { on_timeout(generation); });
}

void RankRecovery::on_timeout(int generation) {
  if (!host_.running() || !recovery_ || recovery_->generation != generation) return;
  std::string missing;
  for (int lr = 0; lr < host_.slot_count(); ++lr)
    if (host_.slot_alive(lr) && !recovery_->joined.count(lr))
      missing += (missing.empty() ? "" : ",") + std::to_string(host_.slot(lr).rank);
  const std::string not_joined = recovery_->joined_here
                                     ? "every rank here joined, another node's did not"
                                     : "not joined: rank " + (missing.empty() ? "-" : missing);
  const std::string why = "generation " + std::to_string(generation) +
                          " did not form within --recovery-timeout=" +
                          fmt::format("{:g}", base::in_seconds(options_.recovery_timeout)) + " s (" + not_joined +
                          ")";
  Failure f;
  f.reason = "rank-scoped recovery failed: " + why;
  f.exit_code = 1;
  f.when = clock_.now();
  give_up(wire::Fallback::kTimeout, why, std::move(f));
}

void RankRecovery::give_up(wire::Fallback reason, const std::string& why, Failure root) {
  fall_back(reason, why);
  host_.stop_group(std::move(root));
}

void RankRecovery::group_stopping(const std::string& why) {
  // Ranks waiting to re-form (on another node's replacement, say) stop
  // waiting at once.
  if (recovery_) fall_back(wire::Fallback::kGroupStopped, why);
}

void RankRecovery::respawn(int lr) {
  const WorkerInfo old = host_.slot(lr);
  const RecoveryHost::Replaced r = host_.replace_slot(lr, generation_);
  if (r.error) {
    spdlog::error("cannot start the replacement for rank {}: {}", old.rank, r.error->what());
    give_up(wire::Fallback::kSpawnFailed, std::string("the replacement could not start: ") + r.error->what(),
            recovery_->failure);
    return;
  }
  replaced(lr, old, r.standby);
}

void RankRecovery::replaced(int lr, const WorkerInfo& old, int standby) {
  const WorkerInfo& now = host_.slot(lr);
  recovery_->spawned = true;
  RecoveryEvent e;
  e.kind = RecoveryEvent::Kind::kReplaced;
  e.generation = generation_;
  e.ranks = {now.rank};
  e.cause = std::string(wire::name(recovery_->cause));
  e.replacement = now;
  e.replaced = old;
  e.standby = standby;
  e.detail = "rank " + std::to_string(now.rank) + " replaced: pid " + std::to_string(old.pid) +
             " -> " + std::to_string(now.pid) +
             (standby ? " (standby " + std::to_string(standby) + ")" : std::string()) +
             ", generation " + std::to_string(generation_);
  hooks(std::move(e));
  wire::Message m;
  m.event = wire::Event::kReady;
  m.generation = generation_;
  m.ranks = {now.rank};
  host_.tell_workers(wire::format(m), lr);
}

void RankRecovery::on_packet(int lr, std::string_view packet) {
  const auto m = wire::parse(packet);
  if (!m) {
    spdlog::debug("recovery channel of local rank {}: malformed packet ignored", lr);
    return;
  }
  if (m->event != wire::Event::kJoined) return;  // nothing else is the worker's to send
  if (!host_.running() || !recovery_ || m->generation != recovery_->generation) {
    spdlog::debug("recovery channel of local rank {}: joined generation {} ignored (current {})",
                  lr, m->generation, generation_);
    return;
  }
  recovery_->joined.insert(lr);
  check_joined();
}

void RankRecovery::check_joined() {
  if (!recovery_ || !recovery_->spawned) return;
  // A rank that ended since (successfully: a failure falls back) has no
  // generation to join.
  for (int lr = 0; lr < host_.slot_count(); ++lr)
    if (host_.slot_alive(lr) && !recovery_->joined.count(lr)) return;
  if (peers_) {
    // Over once every node's ranks are in (generation_formed).
    if (!recovery_->joined_here) peers_->joined(recovery_->generation);
    recovery_->joined_here = true;
    return;
  }
  complete();
}

void RankRecovery::complete() {
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
  e.cause = std::string(wire::name(recovery_->cause));
  e.detail = line;
  recovery_timer_->cancel();
  wire::Message m;
  m.event = wire::Event::kRecovered;
  m.generation = recovery_->generation;
  m.ranks = recovery_->ranks;
  recovery_.reset();
  // To every rank, the replacement too: from here a failure is a new one.
  host_.tell_workers(wire::format(m));
  hooks(std::move(e));
  // The next failure finds a standby too; started only now, so that its
  // start-up (LibTorch, the model) takes no CPU from the recovery.
  host_.recovery_over();
}

void RankRecovery::fall_back(wire::Fallback reason, const std::string& why) {
  victim_timer_->cancel();
  recovery_timer_->cancel();
  const int generation = recovery_ ? recovery_->generation : generation_;
  recovery_.reset();
  const std::string line = "rank-scoped recovery gives up (" + std::string(wire::name(reason)) + "): " + why +
                           "; the whole group stops (and restarts, --max-restarts permitting)";
  spdlog::warn("{}", line);
  wire::Message m;
  m.event = wire::Event::kFallback;
  m.reason = reason;
  host_.tell_workers(wire::format(m));
  RecoveryEvent e;
  e.kind = RecoveryEvent::Kind::kFallback;
  e.generation = generation;
  e.reason = std::string(wire::name(reason));
  e.detail = line;
  hooks(std::move(e));
}

}  // namespace ddprun::agent
