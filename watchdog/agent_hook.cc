// WatchdogHook (agent_hook.h): attempts, workers, the event log and the
// notices about what freeze detection watches.
#include "watchdog/agent_hook.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

#include "agent/worker_env.h"
#include "base/contract.h"
#include "base/steady_clock.h"

namespace ddprun::watchdog {

namespace fs = std::filesystem;

namespace {

std::unique_ptr<base::Clock> clock_unless_given(boost::asio::io_context& io, const HookSeams& seams) {
  if (seams.clock != nullptr) return nullptr;
  return std::make_unique<base::SteadyClock>(io);
}

}  // namespace

WatchdogHook::WatchdogHook(boost::asio::io_context& io, HookOptions options, HookSeams seams)
    : io_(io),
      own_clock_(clock_unless_given(io, seams)),
      clock_(seams.clock != nullptr ? *seams.clock : *own_clock_),
      open_peers_(std::move(seams.open_peers)),
      options_(std::move(options)),
      files_(seams.files ? std::move(seams.files) : make_watchdog_writer()),
      learner_(options_.learner) {
  if (!open_peers_) {
    open_peers_ = [](GuardPlace place, PeerChannel::Changed changed) -> std::unique_ptr<PeerChannel> {
      return std::make_unique<PeerGuards>(std::move(place), std::move(changed));
    };
  }
}

WatchdogHook::~WatchdogHook() {
  alive_.revoke();
  peers_.reset();
  join_capture();
  // Bounded like the capture: a dump still waiting is left behind (it holds copies).
  evidence_.cancel();
  if (!evidence_.join_until(std::chrono::steady_clock::now() + std::chrono::seconds(3)))
    evidence_.abandon();
}

void WatchdogHook::open_event_log() {
  // Not before an attempt began: the run folder is not known yet.
  if (event_log_opened_ || attempt_dir_.empty()) return;
  event_log_opened_ = true;
  // The run directory (parent of attempt_<n>) holds the job's event log.
  const std::string run_dir = fs::path(attempt_dir_).parent_path().string();
  try {
    events_ = std::make_unique<EventLog>(run_dir + "/" + base::kFileEvents, files_);
    events_->echo_to_console(options_.events_to_console);
    events_->write("start", attempt_, {}, "job started",
                   {{"heartbeat_timeout_s", options_.detect.heartbeat_timeout.count() / 1e3},
                    {"hang_timeout", options_.learn ? "auto" : "fixed"},
                    {"hang_timeout_floor_s", options_.learner.floor.count() / 1e3},
                    {"on_hang", to_string(options_.on_hang)},
                    {"silence_timeout_s", options_.detect.silence_timeout.count() / 1e3},
                    {"stuck_timeout_s", options_.detect.effective_stuck_timeout().count() / 1e3},
                    {"file_timer", options_.file_timer}});
  } catch (const std::exception& e) {
    spdlog::warn("no event log: {}", e.what());
  }
  arm_native_notice();
}

void WatchdogHook::begin_attempt(const agent::AttemptInfo& attempt) {
  attempt_ = attempt.restart_count;
  attempt_dir_ = attempt.log_dir;
  report_.reset();
  held_hang_.reset();
  if (held_timer_) held_timer_->cancel();
  control_ = nullptr;
  dog_ = std::make_unique<Watchdog>(
      clock_, options_.detect, [this](const HangEvent& e) { on_hang(e); },
      options_.learn ? &learner_ : nullptr);
  dog_->on_unwatched(
      [this](const std::vector<int>& ranks, Millis setup) { on_unwatched(ranks, setup); });
  judgement_.reset();
  evidence_samples_.clear();
  if (options_.learn)
    dog_->set_judge([this](const HangEvent& e, Watchdog::Verdict done) { judge_stall(e, std::move(done)); });
  // Sockets and FIFOs live in the agent's private folder, never in the log
  // folder another job may share.
  const std::string private_dir =
      attempt.runtime_dir.empty() ? attempt_dir_ : attempt.runtime_dir;
  // A fresh socket per attempt: beats queued by the previous group's
  // workers die with the old socket.
  heartbeats_.reset();
  try {
    heartbeats_ = std::make_unique<HeartbeatServer>(
        io_, choose_socket_path(private_dir), [this](const Beat& received) {
          // Its arrival on the clock of the watchdog's deadlines.
          Beat b = received;
          b.received = clock_.now();
          if (dog_) dog_->on_beat(b);
          if (!beaten_) say_detection_on(b.global_rank);
          beaten_ = true;
          if (native_notice_) native_notice_->cancel();
          if (said_native_off_) {
            // The notice said "off until it beats": say that it does now.
            said_native_off_ = false;
            spdlog::info("freeze detection is on for {}: rank {} beats", options_.program,
                         b.global_rank);
          }
        });
  } catch (const std::exception& e) {
    spdlog::warn("heartbeats disabled for attempt {}: {}", attempt_, e.what());
  }
  timers_.reset();
  if (options_.file_timer) {
    const std::string path = options_.timer_file.empty()
                                 ? private_dir + "/" + base::kFileTimerFifo
                                 : options_.timer_file;
    try {
      timers_ = std::make_unique<FileTimerServer>(io_, path, [this](const FileTimerExpiry& e) {
        if (dog_) dog_->on_file_timer_expiry(e);
      });
    } catch (const std::exception& e) {
      spdlog::warn("torch file timers not served for attempt {}: {}", attempt_, e.what());
    }
  }
}

void WatchdogHook::add_worker_env(const agent::AttemptInfo& attempt, int local_rank,
                                  agent::EnvMap& env) {
  // A new attempt's first worker; not a replacement (--restart-scope=rank),
  // spawned into an attempt whose workers all exist: its peers keep this
  // attempt's socket and watchdog.
  if ((local_rank == 0 && attempt.workers.empty()) || attempt.restart_count != attempt_)
    begin_attempt(attempt);
  if (heartbeats_) env[base::kEnvHeartbeatSocket] = heartbeats_->path();
  if (timers_) env[base::kEnvTimerFile] = timers_->path();
  const bool detecting = options_.learn || options_.detect.any_enabled() || options_.file_timer;
  if (detecting && options_.is_python && !env.count(base::kEnvPythonFaultHandler)) {
    env[base::kEnvPythonFaultHandler] = "1";
  }
}

void WatchdogHook::workers_started(const agent::AttemptInfo& attempt,
                                   agent::AttemptControl& control) {
  // The event log's file is made once the first workers run, not on the
  // path to them, which waits for nothing else (launch time); nothing is
  // written to it before.
  open_event_log();
  info_ = attempt;
  control_ = &control;
  for (const auto& w : attempt.workers) dog_->add_worker(w.local_rank, w.rank, w.pid);
  share_guards(attempt);
  if (events_) {
    events_->write("rendezvous", attempt_, all_ranks(), "workers started",
                   {{"world_size", attempt.round.world_size},
                    {"group_rank", attempt.round.group_rank},
                    {"master_addr", attempt.round.master_addr},
                    {"master_port", attempt.round.master_port},
                    {"heartbeat_socket", heartbeats_ ? heartbeats_->path() : ""}});
  }
}

void WatchdogHook::output(int local_rank, agent::Stream, std::string_view) {
  if (dog_) dog_->on_output(local_rank);
}

void WatchdogHook::worker_exited(const agent::WorkerEnd& end) {
  if (dog_) dog_->on_worker_exit(end.worker.local_rank);
  if (events_) {
    events_->write("worker_exit", attempt_, {end.worker.rank}, end.status.describe(),
                   {{"pid", end.worker.pid}, {"exit_code", end.status.shell_code()}});
  }
}

void WatchdogHook::log_write_failed(int local_rank, const std::string& path,
                                    const std::string& error) {
  if (!events_) return;
  int rank = local_rank;
  for (const auto& w : info_.workers)
    if (w.local_rank == local_rank) rank = w.rank;
  events_->write("log_write_failed", attempt_, {rank}, path + ": " + error, {{"path", path}});
}

void WatchdogHook::attempt_failed(const agent::Failure&) {
  // The attempt is ending (a failed worker, a hang, another hook): the
  // teardown that follows, up to --term-timeout, is not a hang, however
  // quiet the workers become.
  if (dog_) dog_->stop();
}

void WatchdogHook::attempt_interrupted(int) {
  if (dog_) dog_->stop();
  // ddprun is stopping: a stack capture in progress would only delay it.
  if (capture_cancel_) capture_cancel_->cancel();
}

std::vector<int> WatchdogHook::all_ranks() const {
  std::vector<int> ranks;
  for (const auto& w : info_.workers) ranks.push_back(w.rank);
  return ranks;
}

void WatchdogHook::on_unwatched(const std::vector<int>& ranks, Millis setup) {
  // A native program's setup window may end before its notice is due.
  if (native_notice_applies()) return say_native_unwatched(setup);
  // Once per job: the program may never beat, and saying so every attempt
  // would only repeat it.
  if (said_unwatched_) return;
  said_unwatched_ = true;
  spdlog::warn("freeze detection is off for rank(s) {}: no progress beat within {:g} s of start "
               "(beats come from torch's optimizer.step(), forward passes and torch.save/load in "
               "Python workers, ddprun_heartbeat.beat() or watchdog::beat() in the program); it "
               "starts at the rank's first beat. --silence-timeout=S watches output instead.",
               fmt::format("{}", fmt::join(ranks, ",")), setup.count() / 1000.0);
  if (events_) events_->write("detection_off", attempt_, ranks, "no progress beat during setup",
                              {{"setup_s", setup.count() / 1000.0}});
}

bool WatchdogHook::native_notice_applies() const {
  // Only learned detection waits for a first beat without a deadline; a
  // fixed --heartbeat-timeout demands one within the grace, --silence-timeout
  // watches the output, and --hang-timeout=0 asked for nothing.
  return options_.learn && !options_.is_python && options_.detect.silence_timeout.count() == 0;
}

void WatchdogHook::arm_native_notice() {
  // Not at start: a native program that beats (ddprun's own `train`, any
  // program using watchdog/heartbeat.h) would be warned of something that
  // does not apply to it. Only one that has not beaten when this is due.
  if (!native_notice_applies() || beaten_) return;
  const Millis after = std::min(kNativeNoticeAfter, options_.learner.initial_setup);
  native_notice_ = clock_.make_timer();
  native_notice_->arm(clock_.now() + after, [this, after] {
    if (!beaten_) say_native_unwatched(after);
  });
}

void WatchdogHook::say_native_unwatched(Millis waited) {
  if (said_unwatched_) return;
  said_unwatched_ = true;  // the setup window's end would only say it again
  said_native_off_ = true;
  spdlog::warn("freeze detection is off for {}: no rank beat in its first {:g} s, and automatic "
               "beats need a Python worker (a .py script, -m module or python interpreter); a "
               "native program is watched from its first beat through watchdog/heartbeat.h "
               "(LibTorch programs such as ddprun's own `train` beat). --silence-timeout=S watches "
               "its output instead; --hang-timeout=0 silences this line.",
               options_.program, waited.count() / 1000.0);
  if (events_)
    events_->write("detection_off", attempt_, {}, "not a Python worker and no beat yet",
                   {{"program", options_.program}, {"waited_s", waited.count() / 1000.0}});
}

void WatchdogHook::recovery(const agent::RecoveryEvent& e) {
  using Kind = agent::RecoveryEvent::Kind;
  // A failure, here or on another node, explains the stall held for the
  // other nodes' answer; the recovery below re-arms the watchdog.
  if (e.kind == Kind::kFailed) end_deferral(false, fmt::format("rank {} failed", fmt::join(e.ranks, ", ")));
  // The generation this node's blame opened is formed (or given up): a
  // later stall elsewhere must not wait for it.
  if ((e.kind == Kind::kJoined || e.kind == Kind::kFallback) && !shared_.blamed.empty()) {
    shared_.blamed.clear();
    if (peers_) peers_->publish(shared_);
  }
  if (e.kind == Kind::kFailed && dog_ &&
      std::none_of(info_.workers.begin(), info_.workers.end(), [&](const agent::WorkerInfo& w) {
        return std::count(e.ranks.begin(), e.ranks.end(), w.rank) > 0;
      }))
    dog_->peer_replacing();  // another node's ranks: it replaces them, ours wait
  if (e.kind == Kind::kReplaced && e.replacement) {
    for (auto& w : info_.workers)
      if (w.local_rank == e.replacement->local_rank) w = *e.replacement;
    if (dog_) dog_->replace_worker(e.replacement->local_rank, e.replacement->pid);
    close_replaced_hang();
  }
  if (!events_) return;
  switch (e.kind) {
    case Kind::kFailed:
      events_->write("rank_failed", attempt_, e.ranks, e.detail,
                     {{"generation", e.generation}, {"cause", e.cause},
                      {"restarts_left", e.restarts_left}});
      break;
    case Kind::kReplaced:
      // rank_assigned: a pre-started standby took the slot (its pid is the
      // rank's from now on); rank_replaced: a process started at the failure.
      events_->write(e.standby ? "rank_assigned" : "rank_replaced", attempt_, e.ranks, e.detail,
                     {{"generation", e.generation},
                      {"cause", e.cause},
                      {"pid", e.replacement ? e.replacement->pid : -1},
                      {"replaced_pid", e.replaced ? e.replaced->pid : -1},
                      {"standby", e.standby}});
      break;
    case Kind::kJoined:
      events_->write("rank_recovered", attempt_, e.ranks, e.detail,
                     {{"generation", e.generation}, {"cause", e.cause}});
      break;
    case Kind::kFallback:
      events_->write("recovery_fallback", attempt_, e.ranks, e.detail,
                     {{"generation", e.generation}, {"reason", e.reason}});
      break;
  }
}

void WatchdogHook::attempt_ended(const agent::AttemptResult& result) {
  open_event_log();  // workers that could not all be started
  // A capture still running concerns workers that are gone now.
  join_capture();
  last_max_step_ = dog_ ? dog_->max_step() : -1;
  last_hang_.reset();
  held_hang_.reset();  // the attempt ended another way meanwhile
  if (held_timer_) held_timer_->cancel();
  last_report_dir_.clear();
  if (dog_) dog_->stop();
  if (report_) {
    last_hang_ = report_->event;
    last_report_dir_ = attempt_dir_;
    // Faulthandler's tracebacks are in the logs now that the workers died.
    write_report("no faulthandler traceback found in the log");
  }
  if (events_ && result.outcome != agent::Outcome::kFailed) {
    const bool ok = result.outcome == agent::Outcome::kSucceeded;
    events_->write("done", attempt_, all_ranks(),
                   ok ? "succeeded" : "interrupted by " + agent::signal_name(result.signal),
                   {{"max_step", last_max_step_}});
  }
  // Sockets and FIFO go with the attempt; the io_context may still hold
  // their cancelled handlers, which do not touch them.
  heartbeats_.reset();
  timers_.reset();
  peers_.reset();  // the round is over; its records stay in its prefix
  control_ = nullptr;
}

}  // namespace ddprun::watchdog
