#include "agent/attempt.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>
#include <system_error>

#include "base/duration.h"
#include "agent/error_file.h"
#include "agent/line_splitter.h"
#include "agent/spawn.h"
#include "base/contract.h"
#include "base/scoped_fd.h"
#include "agent/worker_streams.h"

namespace ddprun::agent {
namespace {

// After SIGKILL, how long to wait for the kernel to deliver the exits, and
// after the last exit, how long the pipes may take to report EOF.
constexpr auto kKillDeadline = std::chrono::seconds(10);
constexpr auto kDrainDeadline = std::chrono::seconds(2);

}  // namespace

Attempt::Attempt(boost::asio::io_context& io, base::Clock& clock, ProcessLauncher& launcher,
                 const Options& options, AttemptSetup setup, std::vector<AgentHooks*> hooks)
    : io_(io),
      clock_(clock),
      launcher_(launcher),
      options_(options),
      setup_(std::move(setup)),
      hooks_(std::move(hooks)),
      timer_(clock.make_timer()),
      recovery_(*this, clock, options,
                RecoveryPlace{setup_.restart_count, setup_.rank_restarts, setup_.round,
                              setup_.run_id},
                hooks_, io),
      standbys_(options, launcher, *this) {
  info_.restart_count = setup_.restart_count;
  info_.round = setup_.round;
  info_.log_dir =
      setup_.run_dir + "/" + base::kFileAttemptDirPrefix + std::to_string(setup_.attempt_index);
  info_.runtime_dir = setup_.runtime_dir;
  result_.restart_count = setup_.restart_count;
  result_.rank_restarts = recovery_.rank_restarts();
  ptys_ = setup_.consoles.out && setup_.consoles.out->terminal();
}

Attempt::~Attempt() {
  alive_.revoke();
  for (auto* list : {&workers_, &standbys_.workers()})
    for (auto& w : *list) launcher_.release(w.info.pid);
}

void Attempt::start() {
  std::optional<SpawnError> error;
  try {
    for (int lr = 0; lr < setup_.round.local_world_size; ++lr) {
      workers_.push_back(spawn_rank(lr));
      info_.workers.push_back(workers_.back().info);
    }
  } catch (const SpawnError& e) {
    error = e;
  }
  // Every worker is forked before the first exec is waited for (their
  // start-ups overlap); a worker that could not exec was reaped by finish.
  for (auto& w : workers_)
    if (auto failed = finish_exec(w); failed && !error) error = std::move(failed);
  if (error) {
    Failure f;
    f.reason = error->what();
    f.exit_code = error->exit_status();
    f.when = clock_.now();
    record_failure(std::move(f));
    if (workers_.empty()) {
      phase_ = Phase::kDone;
      result_.outcome = Outcome::kFailed;
    } else {
      begin_teardown(SIGKILL);
    }
    throw *error;
  }
  for (auto* h : hooks_) h->workers_started(info_, *this);
  recovery_.start();
  start_standbys();
}

std::optional<SpawnError> Attempt::finish_exec(Worker& w) {
  try {
    launcher_.finish(w.info.pid);
    return std::nullopt;
  } catch (const SpawnError& e) {
    w.alive = false;
    w.never_ran = true;
    if (setup_.stdin_forwarder) setup_.stdin_forwarder->remove_target(w.info.pid);
    return e;
  }
}

Attempt::Worker* Attempt::find(pid_t pid) {
  for (auto& w : workers_)
    if (w.info.pid == pid) return &w;
  return nullptr;
}

bool Attempt::on_exit(pid_t pid, int wait_status) {
  Worker* w = find(pid);
  if (!w || !w->alive) {
    if (!standbys_.on_exit(pid, wait_status, phase_ == Phase::kRunning, recovery_.restarts_left(),
                           recovery_.under_way()))
      return false;
    check_progress();
    return true;
  }
  w->alive = false;
  if (setup_.stdin_forwarder) setup_.stdin_forwarder->remove_target(pid);
  WorkerEnd end{w->info, ExitStatus::from_wait(wait_status), clock_.now()};
  result_.ends.push_back(end);
  for (auto* h : hooks_) h->worker_exited(end);
  if (phase_ == Phase::kRunning && recovery_.on_exit(end)) {
    // Rank scope: only this rank is replaced (rank_recovery.h).
  } else if (phase_ == Phase::kRunning && !end.status.success()) {
    Failure f;
    f.local_rank = w->info.local_rank;
    f.status = end.status;
    f.exit_code = end.status.shell_code();
    f.when = end.when;
    record_failure(std::move(f));
    begin_failure_drain();
  } else if (phase_ == Phase::kPreSignal) {
    bool waiting = false;
    for (int lr : pre_signal_targets_)
      if (workers_[lr].alive) waiting = true;
    if (!waiting) begin_teardown(SIGTERM);
  }
  check_progress();
  return true;
}

void Attempt::begin_failure_drain() {
  // All ranks often fail together (an import error, a bad flag): the slower
  // one is still printing its traceback when the first exits. A stop signal
  // now would cut it off, so the others get up to kFailureDrain to end on
  // their own first; their output flows meanwhile. Ends early once all are
  // reaped, or once every one left is idle (asleep, using no CPU: waiting in
  // a collective for the rank that died, not printing), which is what a
  // crash in training looks like: the restart is not delayed for them.
  phase_ = Phase::kFailureDrain;
  drain_until_ = clock_.now() + kFailureDrain;
  for (auto& w : workers_)
    if (w.alive) (void)launcher_.idle(w.info.pid);  // the first sample
  check_failure_drain();
}

void Attempt::check_failure_drain() {
  timer_->arm(std::min(clock_.now() + kIdleSample, drain_until_), [this] {
    if (phase_ != Phase::kFailureDrain) return;
    bool all_idle = true;
    for (auto& w : workers_) {
      if (!w.alive) continue;
      // Both asked every time: idle() keeps the CPU sample for the next turn.
      const bool asleep = launcher_.idle(w.info.pid);
      if (!asleep || (w.out && w.out->unread()) || (w.err && w.err->unread())) all_idle = false;
    }
    if (all_idle || clock_.now() >= drain_until_)
      begin_teardown(SIGTERM);
    else
      check_failure_drain();
  });
}

void Attempt::record_failure(Failure failure) {
  if (result_.root) return;  // the first failure by monotonic time is the root cause
  result_.outcome = Outcome::kFailed;
  result_.root = std::move(failure);
  for (auto* h : hooks_) h->attempt_failed(*result_.root);
}

void Attempt::interrupt(int sig) {
  if (phase_ == Phase::kDraining || phase_ == Phase::kDone) return;
  if (result_.outcome != Outcome::kInterrupted) {
    result_.outcome = Outcome::kInterrupted;
    result_.signal = sig;
    for (auto* h : hooks_) h->attempt_interrupted(sig);
  }
  if (phase_ == Phase::kRunning || phase_ == Phase::kPreSignal ||
      phase_ == Phase::kFailureDrain) {
    begin_teardown(sig);
  } else {
    kill_now();  // a second signal while tearing down: no more grace
  }
}

void Attempt::fail_attempt(const FailRequest& req) {
  if (phase_ != Phase::kRunning) return;
  if (req.replace_local_rank && recovery_.on_hang(req)) return;
  recovery_.group_stopping(req.reason);
  Failure f;
  f.reason = req.reason;
  f.local_rank = req.local_rank;
  f.exit_code = req.exit_code;
  f.when = clock_.now();
  record_failure(std::move(f));
  if (req.signal == 0) {
    begin_teardown(SIGTERM);
    return;
  }
  pre_signal_targets_.clear();
  for (auto& w : workers_) {
    bool target = req.targets.empty() ||
                  std::count(req.targets.begin(), req.targets.end(), w.info.local_rank);
    if (target && w.alive) {
      pre_signal_targets_.push_back(w.info.local_rank);
      launcher_.signal(w.info.pid, req.signal);
    }
  }
  if (pre_signal_targets_.empty()) {
    begin_teardown(SIGTERM);
    return;
  }
  phase_ = Phase::kPreSignal;
  timer_->arm(clock_.now() + req.wait, [this] {
    if (phase_ == Phase::kPreSignal) begin_teardown(SIGTERM);
  });
}

void Attempt::signal_groups(int sig) {
  // Every group, also of workers already reaped: their children may live on.
  // A group stopped by Ctrl-Z acts on its signal only once continued.
  for (auto* list : {&workers_, &standbys_.workers()})
    for (auto& w : *list) {
      if (w.never_ran) continue;
      launcher_.signal_group(w.info.pid, sig);
      if (sig != SIGKILL) launcher_.signal_group(w.info.pid, SIGCONT);
    }
}

void Attempt::pumps_lossy() {
  // The workers' exits must not wait for a console nobody reads; the log
  // files keep what it cannot take.
  for (auto* list : {&workers_, &retired_, &standbys_.workers()})
    for (auto& w : *list) {
      if (w.out) w.out->set_lossy();
      if (w.err) w.err->set_lossy();
    }
}

void Attempt::stop_workers() {
  for (auto* list : {&workers_, &standbys_.workers()})
    for (auto& w : *list)
      if (!w.never_ran) launcher_.signal_group(w.info.pid, SIGSTOP);
}

void Attempt::continue_workers() {
  for (auto* list : {&workers_, &standbys_.workers()})
    for (auto& w : *list)
      if (!w.never_ran) launcher_.signal_group(w.info.pid, SIGCONT);
}

void Attempt::continue_running_workers() {
  for (auto& w : workers_)
    if (w.alive) launcher_.signal_group(w.info.pid, SIGCONT);
}

void Attempt::resize_terminals() {
  if (!ptys_) return;
  for (auto& w : workers_) {
    winsize size;
    std::string prefix = make_line_prefix(options_.log_line_prefix_template, options_.role,
                                          w.info.rank, w.info.local_rank, options_.hostname);
    if (!console_window(setup_.consoles.out->fd(), prefix.size(), size)) return;
    for (auto* pump : {w.out.get(), w.err.get()})
      if (pump && pump->open()) (void)ioctl(pump->fd(), TIOCSWINSZ, &size);
    // Not the workers' controlling terminal: the kernel signals nobody.
    if (w.alive) launcher_.signal_group(w.info.pid, SIGWINCH);
  }
}

void Attempt::begin_teardown(int sig) {
  if (sig == SIGKILL) {
    kill_now();
    return;
  }
  phase_ = Phase::kTerminating;
  pumps_lossy();
  signal_groups(sig);
  timer_->arm(clock_.now() + options_.term_timeout, [this] {
    if (phase_ != Phase::kTerminating) return;
    for (auto& w : workers_)
      if (w.alive)
        spdlog::warn("rank {} (pid {}) still running {} s after the stop signal; sending SIGKILL",
                     w.info.rank, w.info.pid, base::in_seconds(options_.term_timeout));
    kill_now();
  });
  check_progress();
}

void Attempt::kill_all() {
  // The cgroup first: it also holds what left the workers' groups.
  launcher_.kill_job();
  signal_groups(SIGKILL);
}

void Attempt::kill_now() {
  phase_ = Phase::kKilled;
  pumps_lossy();
  kill_all();
  timer_->arm(clock_.now() + kKillDeadline, [this] {
    if (phase_ != Phase::kKilled) return;
    for (auto& w : workers_)
      if (w.alive) {
        spdlog::error("rank {} (pid {}) did not exit {} s after SIGKILL; giving up on it",
                      w.info.rank, w.info.pid, kKillDeadline.count());
        w.alive = false;
      }
    standbys_.forget();
    check_progress();
  });
  check_progress();
}

bool Attempt::pumps_open() const {
  for (const auto* list : {&workers_, &retired_, &standbys_.workers()})
    for (const auto& w : *list)
      if ((w.out && w.out->open()) || (w.err && w.err->open())) return true;
  return false;
}

void Attempt::check_progress() {
  if (phase_ == Phase::kDone) return;
  if (phase_ == Phase::kDraining) {
    if (!pumps_open()) finish();
    return;
  }
  for (const auto& w : workers_)
    if (w.alive) return;
  if (standbys_.end()) return;
  all_reaped();
}

void Attempt::all_reaped() {
  if (workers_.empty()) return;
  phase_ = Phase::kDraining;
  // Whatever the workers left behind (in the job cgroup, their groups or
  // re-parented to us, the subreaper) ends with the attempt.
  kill_all();
  launcher_.sweep_leftovers();
  timer_->arm(clock_.now() + kDrainDeadline, [this] {
    if (phase_ == Phase::kDraining) finish();
  });
  if (!pumps_open()) finish();
}

void Attempt::finish() {
  if (phase_ == Phase::kDone) return;
  phase_ = Phase::kDone;
  timer_->cancel();
  recovery_.stop();
  result_.rank_restarts = recovery_.rank_restarts();
  if (setup_.stdin_forwarder) setup_.stdin_forwarder->clear_target();
  for (auto* list : {&workers_, &retired_, &standbys_.workers()})
    for (auto& w : *list) {
      if (w.out) w.out->close();
      if (w.err) w.err->close();
      // A retired worker's pid and channel went with its replacement.
      if (list == &retired_) continue;
      if (w.channel) w.channel->close();
      launcher_.release(w.info.pid);
    }
  if (result_.root && result_.root->local_rank) {
    int lr = *result_.root->local_rank;
    if (lr >= 0 && lr < static_cast<int>(workers_.size()))
      result_.root->error = read_error_file(workers_[lr].info.error_file);
  }
  // Hooks read what the workers wrote last (faulthandler's traceback in
  // stderr.log): the log writer's queue goes first. Bounded: a stalled log
  // folder costs the loop at most this once per attempt, and the hook then
  // finds the file as far as it got.
  if (setup_.log_writer)
    (void)setup_.log_writer->flush(std::chrono::steady_clock::now() + std::chrono::seconds(2));
  for (auto* h : hooks_) h->attempt_ended(result_);
}

void Attempt::start_standbys() {
  if (!rank_scope() || phase_ != Phase::kRunning) return;
  standbys_.refill(recovery_.restarts_left(), recovery_.generation());
}

void Attempt::signal_slot(int lr, int sig, bool whole_group) {
  const Worker& w = workers_[lr];
  if (whole_group)
    launcher_.signal_group(w.info.pid, sig);
  else
    launcher_.signal(w.info.pid, sig);
}

void Attempt::tell_workers(const std::string& packet, int except) {
  for (auto& w : workers_) {
    if (!w.alive || !w.channel || w.info.local_rank == except) continue;
    // A full socket drops it: a worker that never reads costs nothing.
    if (!w.channel->send(packet))
      spdlog::debug("recovery channel of rank {}: '{}' not delivered", w.info.rank, packet);
  }
}

void Attempt::stop_group(Failure root) {
  record_failure(std::move(root));
  begin_teardown(SIGTERM);
}

RecoveryHost::Replaced Attempt::replace_slot(int lr, int generation) {
  Worker& old = workers_[lr];
  // The rest of its process group (a data loader, a shell's child) goes
  // with it before anything takes its place.
  if (!old.never_ran) launcher_.signal_group(old.info.pid, SIGKILL);
  launcher_.release(old.info.pid);
  if (old.channel) old.channel->close();
  // --standby-workers: a process that is already initialised takes the
  // slot, rather than one that starts now (standby_pool.h).
  Replaced r;
  if (auto s = standbys_.assign(lr, info_.workers[lr].rank, generation)) {
    std::swap(workers_[lr], *s);
    // The replaced worker's pumps drain to EOF; finish() closes them.
    retired_.push_back(std::move(*s));
    info_.workers[lr] = workers_[lr].info;
    r.standby = workers_[lr].standby;
    return r;
  }
  try {
    Worker fresh = spawn_rank(lr, true);
    std::swap(workers_[lr], fresh);
    // The replaced worker's pumps drain to EOF; finish() closes them.
    retired_.push_back(std::move(fresh));
  } catch (const SpawnError& e) {
    r.error = e;
    return r;
  }
  info_.workers[lr] = workers_[lr].info;
  r.error = finish_exec(workers_[lr]);
  return r;
}

}  // namespace ddprun::agent
