#include "watchdog/agent_hook.h"

#include <signal.h>
#include <sys/resource.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <boost/asio/post.hpp>
#include <filesystem>

#include "agent/worker_env.h"
#include "base/contract.h"
#include "base/procfs.h"
#include "base/system_error.h"
#include "watchdog/live_stack.h"

namespace ddprun::watchdog {

namespace fs = std::filesystem;

std::string heartbeat_python_dir() {
  return base::installed_or(DDPRUN_WATCHDOG_PYTHON_INSTALL_DIR, "ddprun_heartbeat.py",
                            DDPRUN_WATCHDOG_PYTHON_DIR);
}

namespace {

Millis to_ms(double seconds) { return Millis(static_cast<int64_t>(seconds * 1000.0 + 0.5)); }

std::string base_env_value(const agent::Options& o, const std::string& key) {
  for (const auto& kv : o.base_env) {
    if (kv.size() > key.size() && kv.compare(0, key.size(), key) == 0 && kv[key.size()] == '=') {
      return kv.substr(key.size() + 1);
    }
  }
  return {};
}

}  // namespace

const char* to_string(OnHang action) {
  switch (action) {
    case OnHang::kRestart: return "restart";
    case OnHang::kExit: return "exit";
    case OnHang::kReport: return "report";
  }
  return "?";
}

HookOptions hook_options_from(const agent::Options& o) {
  HookOptions h;
  h.detect.heartbeat_timeout = to_ms(o.heartbeat_timeout_s);
  // --heartbeat-timeout wins; else --hang-timeout=S is the same fixed
  // timeout, auto (negative) learns, 0 is off.
  if (h.detect.heartbeat_timeout.count() == 0 && o.hang_timeout_s > 0)
    h.detect.heartbeat_timeout = to_ms(o.hang_timeout_s);
  h.learn = h.detect.heartbeat_timeout.count() == 0 && o.hang_timeout_s < 0;
  h.learner.floor = std::max(Millis(1), to_ms(o.hang_timeout_floor_s));
  // --heartbeat-grace is the setup's timeout in learned mode too (spawn to
  // the first beat; its end only says detection is off, never kills).
  if (o.heartbeat_grace_s > 0) h.learner.initial_setup = to_ms(o.heartbeat_grace_s);
  if (o.on_hang == "restart") {
    h.on_hang = OnHang::kRestart;
  } else if (o.on_hang == "exit") {
    h.on_hang = OnHang::kExit;
  } else if (o.on_hang == "report") {
    h.on_hang = OnHang::kReport;
  } else {
    h.on_hang = o.max_restarts > 0 ? OnHang::kRestart : OnHang::kExit;
  }
  h.detect.heartbeat_grace = to_ms(o.heartbeat_grace_s);
  h.detect.silence_timeout = to_ms(o.silence_timeout_s);
  if (o.stuck_timeout_s >= 0) h.detect.stuck_timeout = to_ms(o.stuck_timeout_s);
  // --stack-capture (the launcher checked the value): a named tool only,
  // /proc only, or no capture at all.
  if (o.stack_capture == "eu-stack") h.stacks.gdb.clear();
  if (o.stack_capture == "gdb") h.stacks.eu_stack.clear();
  if (o.stack_capture == "proc") {
    h.stacks.eu_stack.clear();
    h.stacks.gdb.clear();
  }
  if (o.stack_capture == "none") {
    h.max_native_captures = 0;
    h.live_stacks = false;
  }
  h.is_python = o.is_python;
  if (!o.command.empty()) h.program = o.command.front();
  h.events_to_console = o.events_to_console;
  // torchrun: the server runs only for the exact value "1".
  h.file_timer = base_env_value(o, base::kEnvEnableFileTimer) == "1";
  h.timer_file = base_env_value(o, base::kEnvTimerFile);
  h.logs_kept = !o.log_dir.empty();
  h.rank_scope = o.restart_scope == agent::RestartScope::kRank;
  return h;
}

RestartRulesOptions restart_options_from(const agent::Options& o) {
  RestartRulesOptions r;
  r.max_restarts = o.max_restarts;
  r.backoff_initial = to_ms(o.restart_backoff_s);
  r.max_no_progress_restarts = o.max_no_progress_restarts;
  r.no_restart_exit_codes = o.no_restart_exit_codes;
  return r;
}

WatchdogHook::WatchdogHook(boost::asio::io_context& io, HookOptions options)
    : io_(io), options_(std::move(options)), learner_(options_.learner) {}

WatchdogHook::~WatchdogHook() {
  *alive_ = false;
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
        io_, choose_socket_path(private_dir), [this](const Beat& b) {
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
  // path to them (issue 24); nothing is written to it before.
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

void WatchdogHook::no_core_dumps(pid_t pid) const {
  // faulthandler prints the traceback, then re-raises SIGABRT: under
  // `ulimit -c unlimited` that would leave a core the size of the process
  // in the user's folder.
  const rlimit none{0, 0};
  if (::prlimit(pid, RLIMIT_CORE, &none, nullptr) != 0) {
    spdlog::warn("cannot set the core limit of pid {} to 0 before SIGABRT: {}", pid,
                 base::errno_text(errno));
  }
}

void WatchdogHook::on_hang(const HangEvent& event) {
  if (!defer_hang(event)) act_on_hang(event);
}

void WatchdogHook::act_on_hang(const HangEvent& event) {
  // Before the stack capture (seconds): nodes holding a stall of theirs
  // wait for this node's generation instead of acting after kAskPeers.
  if (replaces_culprit()) say_blamed(dog_->culprit(event));
  report_ = make_hang_report(*dog_, event, attempt_);
  report_->action = to_string(options_.on_hang);
  take_evidence(*report_);
  hang_event_ = event;
  const bool report_only = options_.on_hang == OnHang::kReport;
  // Stacks for the stalled ranks and the suspects, the event's rank first.
  // When no rank is behind in steps, the other live ranks too: the rank that
  // stopped first may still be inside its deadline while the first rank past
  // it waits for it in a collective (HangReport::find_culprit tells which).
  std::vector<int> ranks = report_->stalled;
  for (int r : report_->suspects) {
    if (std::find(ranks.begin(), ranks.end(), r) == ranks.end()) ranks.push_back(r);
  }
  bool same_step = true;  // no live rank is behind another
  for (const auto& a : report_->workers)
    for (const auto& b : report_->workers)
      if (!a.exited && !b.exited && a.step != b.step) same_step = false;
  if (same_step) {
    for (const auto& w : report_->workers) {
      if (!w.exited && std::find(ranks.begin(), ranks.end(), w.global_rank) == ranks.end())
        ranks.push_back(w.global_rank);
    }
  }
  abort_targets_.clear();  // local ranks that print their own traceback
  std::vector<std::pair<pid_t, int>> natives;  // (pid, global rank) for a tool
  int captures_left = options_.max_native_captures;
  std::vector<std::pair<pid_t, int>> live;  // Python workers that dump their own stacks
  for (int rank : ranks) {
    auto it = std::find_if(info_.workers.begin(), info_.workers.end(),
                           [&](const auto& w) { return w.rank == rank; });
    if (it == info_.workers.end()) continue;
    // The evidence already holds its stack, dumped live.
    if (std::any_of(report_->stacks.begin(), report_->stacks.end(),
                    [&](const StackCapture& c) { return c.global_rank == rank && !c.text.empty(); }))
      continue;
    // ddprun's sitecustomize dumps it live on a signal, without stopping the
    // worker or printing on the console (live_stack.h): before the headline,
    // so the stacks can name the culprit.
    if (const auto sig = options_.live_stacks ? base::proc_environ_value(it->pid, base::kEnvPyStackSignal)
                                              : std::nullopt;
        sig && base::catches_signal(it->pid, std::atoi(sig->c_str()))) {
      live.emplace_back(it->pid, rank);
      continue;
    }
    // --on-hang=report: SIGABRT would end the worker; native stacks only.
    // Rank scope: so it would the survivors; the culprit's comes in
    // finish_hang, once the stacks have named it.
    if (!report_only && !replaces_culprit() && python_faulthandler_enabled(it->pid)) {
      StackCapture c;
      c.global_rank = rank;
      c.pid = it->pid;
      c.method = StackMethod::kPythonFaulthandler;
      c.path = it->stderr_log;
      if (c.path.empty()) c.note = "traceback printed to the console (no --log-dir)";
      report_->stacks.push_back(c);
      abort_targets_.push_back(it->local_rank);
    } else if (captures_left-- > 0) {
      natives.emplace_back(it->pid, rank);
    }
  }
  if (natives.empty() && live.empty()) return finish_hang();
  // A capture tool may take seconds (gdb on a LibTorch process, a slow
  // ptrace): it runs on a thread of its own and posts the stacks back, so
  // the loop goes on handling signals, exits and output meanwhile.
  if (!natives.empty()) spdlog::info("capturing the stacks of {} hung rank(s)", natives.size());
  join_capture();
  capture_cancel_ = std::make_shared<CaptureCancel>();
  // The work holds only copies (base/off_loop_task.h): it may be left
  // running, past join_capture's deadline, without touching this hook.
  auto captured = std::make_shared<std::vector<StackCapture>>();
  capture_.start(
      [natives, live, dir = attempt_dir_, stacks = options_.stacks, cancel = capture_cancel_,
       captured](const base::OffLoopTask::Token&) {
        for (const auto& [pid, rank] : live) {
          if (cancel->cancelled()) break;
          auto dump = dump_python_stack(pid, std::chrono::milliseconds(2000));
          if (dump.ok) {
            StackCapture c;
            c.global_rank = rank;
            c.pid = pid;
            c.method = StackMethod::kPythonFaulthandler;
            c.text = std::move(dump.text);
            c.note = "dumped live by the worker (ddprun's stack signal)";
            captured->push_back(std::move(c));
            continue;
          }
          // No live dump: its frames read from outside, as for a worker
          // without the bootstrap.
          captured->push_back(capture_python_stack(pid, rank, dir, stacks, cancel.get()));
          captured->push_back(capture_native_stack(pid, rank, dir, stacks, cancel.get()));
        }
        for (const auto& [pid, rank] : natives) {
          // A Python worker that will not print its own traceback (no
          // faulthandler: `python -I`, a reset PYTHONPATH; or --on-hang=report,
          // where SIGABRT would end it): its frames read from outside.
          if (runs_python(pid))
            captured->push_back(capture_python_stack(pid, rank, dir, stacks, cancel.get()));
          captured->push_back(capture_native_stack(pid, rank, dir, stacks, cancel.get()));
        }
      },
      [this](std::function<void()> done) { boost::asio::post(io_, std::move(done)); },
      [this, captured, attempt = attempt_, cancel = capture_cancel_, alive = alive_] {
        if (!*alive || attempt != attempt_ || cancel != capture_cancel_ || !report_) return;
        report_->stacks.insert(report_->stacks.end(), captured->begin(), captured->end());
        finish_hang();
      });
}

void WatchdogHook::join_capture() {
  if (capture_cancel_) capture_cancel_->cancel();
  capture_.cancel();
  // Bounded: cancel kills the tool running, and the thread tries no other;
  // a tool that outlives even that is left behind, not waited for.
  if (!capture_.join_until(std::chrono::steady_clock::now() + std::chrono::seconds(10))) {
    spdlog::warn("a stack capture did not stop within 10 s of its cancel; left behind");
    capture_.abandon();
  }
  // A result still queued in the loop is for workers that are gone: dropped.
  capture_cancel_.reset();
}

void WatchdogHook::finish_hang() {
  const HangEvent& event = hang_event_;
  for (const auto& w : info_.workers) {
    if (!w.stdout_log.empty()) report_->worker_logs.emplace_back(w.rank, w.stdout_log);
    if (!w.stderr_log.empty()) report_->worker_logs.emplace_back(w.rank, w.stderr_log);
  }
  report_->find_culprit();  // Python tracebacks printed at teardown come later
  report_->write_later(*files_, attempt_dir_);  // off the loop
  if (events_) {
    events_->write("hang_detected", attempt_, report_->stalled, event.detail,
                   {{"kind", to_string(event.kind)},
                    {"rank", event.global_rank},
                    {"suspects", report_->suspects},
                    {"detected_after_due_ms",
                     std::chrono::duration<double, std::milli>(event.detected - event.due).count()},
                    {"culprit", report_->culprit},
                    {"culprit_state", to_string(report_->culprit_state)},
                    {"evidence", report_->evidence},
                    {"report", attempt_dir_ + "/" + base::kFileHangReportJson}});
  }
  const std::string summary = report_->summary(options_.logs_kept ? attempt_dir_ : "");
  const char* what = options_.on_hang == OnHang::kReport
                         ? "reporting only (--on-hang=report): the job keeps running"
                     : options_.on_hang == OnHang::kExit ? "ending the job (exit status 124)"
                     : replaces_culprit()
                         ? "replacing that rank (--restart-scope=rank, --max-restarts permitting)"
                         : "restarting the group (--max-restarts permitting)";
  // The one warning, culprit first (the summary's headline).
  spdlog::warn("freeze: rank {} is the culprit; {}. {}", report_->culprit, what, summary);
  if (options_.on_hang == OnHang::kReport) {
    last_report_dir_ = attempt_dir_;
    report_.reset();
    if (dog_) dog_->rearm_after_report();
    return;
  }
  agent::FailRequest req;
  req.reason = summary;
  req.local_rank = event.local_rank;
  // The job's status when this hang ends it (no restart left, or exit).
  req.exit_code = kExitHang;
  if (replaces_culprit()) {
    auto it = std::find_if(info_.workers.begin(), info_.workers.end(),
                           [&](const auto& w) { return w.rank == report_->culprit; });
    if (it != info_.workers.end()) {
      req.replace_local_rank = it->local_rank;
      // Its own traceback, unless it was dumped live already.
      const bool dumped = std::any_of(report_->stacks.begin(), report_->stacks.end(), [&](const StackCapture& c) {
        return c.global_rank == it->rank && !c.text.empty();
      });
      if (!dumped && python_faulthandler_enabled(it->pid)) {
        StackCapture c;
        c.global_rank = it->rank;
        c.pid = it->pid;
        c.method = StackMethod::kPythonFaulthandler;
        c.path = it->stderr_log;
        if (c.path.empty()) c.note = "traceback printed to the console (no --log-dir)";
        report_->stacks.push_back(c);
        abort_targets_ = {it->local_rank};
      }
    }
  }
  if (!abort_targets_.empty()) {
    req.signal = SIGABRT;
    req.targets = abort_targets_;
    req.wait = options_.traceback_wait;
    for (const auto& w : info_.workers) {
      if (std::count(abort_targets_.begin(), abort_targets_.end(), w.local_rank)) no_core_dumps(w.pid);
    }
  }
  // Null when the attempt already ended another way during the capture.
  if (control_) control_->fail_attempt(req);
  // Stopped workers would hold the pending SIGABRT/SIGTERM until SIGKILL:
  // continue them so the teardown is quick.
  for (const auto& w : info_.workers) ::kill(-w.pid, SIGCONT);
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

void WatchdogHook::write_report(const char* no_traceback_note) {
  for (auto& s : report_->stacks) {
    if (s.method != StackMethod::kPythonFaulthandler || s.path.empty()) continue;
    s.text = extract_python_traceback(s.path);
    if (s.text.empty()) s.note = no_traceback_note;
  }
  // Python tracebacks arrive only now, after the headline named the
  // culprit: they go in the report (stack_culprit_rank), the blame stays.
  report_->find_culprit(false);
  report_->write_later(*files_, attempt_dir_);  // off the loop
  if (!options_.logs_kept)
    spdlog::warn("hang report (not kept on disk without --log-dir):\n{}", report_->to_text());
}

void WatchdogHook::close_replaced_hang() {
  if (!report_) return;
  // The culprit is gone: its faulthandler traceback is in its log as far
  // as the log writer got (the rest follows in the same file).
  write_report("no faulthandler traceback found in the log yet");
  last_report_dir_ = attempt_dir_;
  report_.reset();
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

agent::RestartDecision JobRestartPolicy::decide(const agent::AttemptResult& failed,
                                                int max_restarts) {
  if (!rules_) {
    options_.max_restarts = max_restarts;
    rules_.emplace(options_);
  }
  AttemptOutcome o;
  // Replacements of single ranks (--restart-scope=rank) spent restarts too.
  o.restart_count = failed.restart_count + failed.rank_restarts;
  o.hang = hook_ && hook_->last_attempt_hung();
  // Without restarts the rules below stop anyway (rule max_restarts).
  if (hook_ && hook_->last_hang_ends_job() && max_restarts > 0) {
    if (auto* ev = hook_->events()) {
      ev->write("done", failed.restart_count, {}, "failed: freeze detected (--on-hang=exit)",
                {{"rule", "on_hang_exit"}, {"hang", true}, {"max_step", hook_->last_attempt_max_step()}});
    }
    agent::RestartDecision out;
    out.restart = false;
    out.why = "a freeze was detected and --on-hang is exit (the default without --max-restarts)";
    return out;
  }
  o.max_step = hook_ ? hook_->last_attempt_max_step() : -1;
  // Only the root cause's own exit code: the rest were stopped by teardown.
  if (failed.root && failed.root->status) o.exit_codes.push_back(failed.root->status->shell_code());
  const RuleDecision d = rules_->on_attempt_end(o);
  if (auto* ev = hook_ ? hook_->events() : nullptr) {
    ev->write(d.restart ? "restart" : "done", failed.restart_count, {},
              d.restart ? d.reason : "failed: " + d.reason,
              {{"rule", to_string(d.rule)}, {"delay_ms", d.delay.count()},
               {"hang", o.hang}, {"max_step", o.max_step}});
  }
  agent::RestartDecision out;
  out.restart = d.restart;
  out.delay = d.delay;
  out.why = d.reason;
  return out;
}

}  // namespace ddprun::watchdog
