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
#include <set>
#include <system_error>

#include "agent/error_file.h"
#include "agent/line_splitter.h"
#include "agent/process_tree.h"
#include "agent/spawn.h"
#include "base/scoped_fd.h"
#include "agent/worker_streams.h"

namespace ddprun::agent {
namespace {

namespace fs = std::filesystem;

// After SIGKILL, how long to wait for the kernel to deliver the exits, and
// after the last exit, how long the pipes may take to report EOF.
constexpr auto kKillDeadline = std::chrono::seconds(10);
constexpr auto kDrainDeadline = std::chrono::seconds(2);
constexpr auto kSweepDeadline = std::chrono::seconds(5);

base::ScopedFd open_log(const std::string& path) {
  base::ScopedFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) throw SpawnError("cannot open log file " + path + ": " + strerror(errno), errno);
  return fd;
}

std::chrono::milliseconds seconds_to_ms(double s) {
  return std::chrono::milliseconds(static_cast<long long>(s * 1000.0));
}

}  // namespace

Attempt::Attempt(boost::asio::io_context& io, const Options& options, AttemptSetup setup,
                 std::vector<AgentHooks*> hooks, Guardian& guardian)
    : io_(io),
      options_(options),
      setup_(std::move(setup)),
      hooks_(std::move(hooks)),
      guardian_(guardian),
      timer_(io) {
  info_.restart_count = setup_.restart_count;
  info_.round = setup_.round;
  info_.log_dir = setup_.run_dir + "/attempt_" + std::to_string(setup_.attempt_index);
  info_.runtime_dir = setup_.runtime_dir;
  result_.restart_count = setup_.restart_count;
  ptys_ = setup_.consoles.out && setup_.consoles.out->terminal();
}

Attempt::~Attempt() {
  *alive_ = false;
  for (auto& w : workers_) guardian_.remove_group(w.info.pid);
}

void Attempt::start() {
  try {
    for (int lr = 0; lr < setup_.round.local_world_size; ++lr) spawn_worker(lr);
  } catch (const SpawnError& e) {
    Failure f;
    f.reason = e.what();
    f.exit_code = e.exit_status();
    f.when = Clock::now();
    record_failure(std::move(f));
    if (workers_.empty()) {
      phase_ = Phase::kDone;
      result_.outcome = Outcome::kFailed;
    } else {
      begin_teardown(SIGKILL);
    }
    throw;
  }
  for (auto* h : hooks_) h->workers_started(info_, *this);
}

void Attempt::spawn_worker(int lr) {
  const RoundInfo& round = setup_.round;
  WorkerInfo w;
  w.local_rank = lr;
  w.rank = round.rank_base + lr;
  w.is_python = options_.is_python;
  std::string dir = info_.log_dir + "/" + std::to_string(lr);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw SpawnError("cannot create log directory " + dir + ": " + ec.message(), ec.value());
  w.error_file = dir + "/error.json";
  fs::remove(w.error_file, ec);  // a stale file would be blamed on this attempt

  // torchrun's rules: a redirected stream goes to its file only, a teed
  // one to its file and the console (tee wins); --log-dir files every one.
  int redirected = options_.redirects.for_rank(lr);
  int teed = options_.tee.for_rank(lr);
  int filed = setup_.log_every_stream ? kStdAll : (redirected | teed);
  int shown_streams = kStdAll & ~(redirected & ~teed);
  if (!options_.local_ranks_filter.empty() && !options_.local_ranks_filter.count(lr))
    shown_streams = kStdNone;
  base::ScopedFd out_log, err_log;
  if (filed & kStdOut) out_log = open_log(w.stdout_log = dir + "/stdout.log");
  if (filed & kStdErr) err_log = open_log(w.stderr_log = dir + "/stderr.log");

  WorkerEnvInput in;
  in.local_rank = lr;
  in.rank = w.rank;
  in.local_world_size = round.local_world_size;
  in.world_size = round.world_size;
  in.group_rank = round.group_rank;
  in.group_world_size = round.group_world_size;
  // One role per job: role ranks are the global ranks.
  in.role_rank = w.rank;
  in.role_world_size = round.world_size;
  in.role_name = options_.role;
  in.master_addr = round.master_addr;
  in.master_port = round.master_port;
  in.restart_count = setup_.restart_count;
  in.max_restarts = options_.max_restarts;
  in.run_id = setup_.run_id;
  in.error_file = w.error_file;
  in.attempt_log_dir = options_.log_dir.empty() ? "" : info_.log_dir;
  in.store_addr = round.store_addr;
  in.store_prefix = round.store_prefix;
  in.store_token = round.store_token;
  if (options_.is_python) in.pythonpath_prepend = options_.pythonpath_prepend;
  in.signals_to_handle = options_.signals_to_handle_spec;
  EnvMap env = setup_.base_env;
  add_worker_env(in, env);
  if (options_.virtual_local_rank) use_virtual_local_rank(lr, env);
  for (auto* h : hooks_) h->add_worker_env(info_, lr, env);

  std::string prefix = make_line_prefix(options_.log_line_prefix_template, options_.role, w.rank,
                                        lr, options_.hostname);
  StreamPlan plan;
  plan.pty = ptys_;
  if (plan.pty) console_window(setup_.consoles.out->fd(), prefix.size(), plan.size);
  if (options_.stdin_rank == w.rank)
    plan.stdin_mode = setup_.stdin_forwarder ? StdinMode::kForward : StdinMode::kInherit;
  WorkerStreams streams = open_worker_streams(plan);
  SpawnRequest req;
  req.path = setup_.program_path;
  req.argv = options_.command;
  req.env = env_to_strings(env);
  req.stdin_fd = streams.in_child.get();
  req.stdout_fd = streams.out_write.get();
  req.stderr_fd = streams.err_write.get();
  req.cgroup_procs_fd = setup_.cgroup ? setup_.cgroup->procs_fd() : -1;
  req.nofile_limit = setup_.worker_nofile_limit;
  if (static_cast<size_t>(lr) < options_.worker_cpus.size()) req.cpus = options_.worker_cpus[lr];
  w.pid = spawn_process(req);
  guardian_.add_group(w.pid);

  Worker worker;
  worker.info = w;
  worker.alive = true;
  auto make_pump = [&](base::ScopedFd& read, base::ScopedFd& log, Stream stream, int mask) {
    PumpConfig c;
    c.prefix = prefix;
    c.console = stream == Stream::kStdout ? setup_.consoles.out : setup_.consoles.err;
    c.shown = shown_streams & mask;
    c.log_path = stream == Stream::kStdout ? w.stdout_log : w.stderr_log;
    c.log = std::move(log);
    if (!hooks_.empty())
      c.on_data = [this, lr, stream](std::string_view data) {
        for (auto* h : hooks_) h->output(lr, stream, data);
      };
    c.on_eof = [this, alive = alive_] {
      if (*alive) check_progress();
    };
    c.on_log_error = [this, lr, alive = alive_](const std::string& path, int err) {
      if (!*alive) return;
      std::string error = strerror(err);
      spdlog::warn("cannot write {}: {}; its output goes on to the console", path, error);
      result_.log_errors.push_back(path + ": " + error);
      for (auto* h : hooks_) h->log_write_failed(lr, path, error);
    };
    return std::make_unique<OutputPump>(io_, read.release(), std::move(c));
  };
  worker.out = make_pump(streams.out_read, out_log, Stream::kStdout, kStdOut);
  worker.err = make_pump(streams.err_read, err_log, Stream::kStderr, kStdErr);
  worker.out->start();
  worker.err->start();
  if (streams.input.get() >= 0)
    setup_.stdin_forwarder->set_target(std::move(streams.input), streams.input_is_pty);
  info_.workers.push_back(w);
  workers_.push_back(std::move(worker));
}

Attempt::Worker* Attempt::find(pid_t pid) {
  for (auto& w : workers_)
    if (w.info.pid == pid) return &w;
  return nullptr;
}

bool Attempt::on_exit(pid_t pid, int wait_status) {
  Worker* w = find(pid);
  if (!w || !w->alive) return false;
  w->alive = false;
  WorkerEnd end{w->info, ExitStatus::from_wait(wait_status), Clock::now()};
  result_.ends.push_back(end);
  for (auto* h : hooks_) h->worker_exited(end);
  if (phase_ == Phase::kRunning && !end.status.success()) {
    Failure f;
    f.local_rank = w->info.local_rank;
    f.status = end.status;
    f.exit_code = end.status.shell_code();
    f.when = end.when;
    record_failure(std::move(f));
    begin_teardown(SIGTERM);
  } else if (phase_ == Phase::kPreSignal) {
    bool waiting = false;
    for (int lr : pre_signal_targets_)
      if (workers_[lr].alive) waiting = true;
    if (!waiting) begin_teardown(SIGTERM);
  }
  check_progress();
  return true;
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
  if (phase_ == Phase::kRunning || phase_ == Phase::kPreSignal) {
    begin_teardown(sig);
  } else {
    kill_now();  // a second signal while tearing down: no more grace
  }
}

void Attempt::fail_attempt(const FailRequest& req) {
  if (phase_ != Phase::kRunning) return;
  Failure f;
  f.reason = req.reason;
  f.local_rank = req.local_rank;
  f.exit_code = req.exit_code;
  f.when = Clock::now();
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
      kill(w.info.pid, req.signal);
    }
  }
  if (pre_signal_targets_.empty()) {
    begin_teardown(SIGTERM);
    return;
  }
  phase_ = Phase::kPreSignal;
  timer_.expires_after(req.wait);
  timer_.async_wait([this, alive = alive_](const boost::system::error_code& ec) {
    if (!ec && *alive && phase_ == Phase::kPreSignal) begin_teardown(SIGTERM);
  });
}

void Attempt::signal_groups(int sig) {
  // Every group, also of workers already reaped: their children may live on.
  // A group stopped by Ctrl-Z acts on its signal only once continued.
  for (auto& w : workers_) {
    kill(-w.info.pid, sig);
    if (sig != SIGKILL) kill(-w.info.pid, SIGCONT);
  }
}

void Attempt::pumps_lossy() {
  // The workers' exits must not wait for a console nobody reads; the log
  // files keep what it cannot take.
  for (auto& w : workers_) {
    if (w.out) w.out->set_lossy();
    if (w.err) w.err->set_lossy();
  }
}

void Attempt::stop_workers() {
  for (auto& w : workers_) kill(-w.info.pid, SIGSTOP);
}

void Attempt::continue_workers() {
  for (auto& w : workers_) kill(-w.info.pid, SIGCONT);
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
    if (w.alive) kill(-w.info.pid, SIGWINCH);
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
  timer_.expires_after(seconds_to_ms(options_.term_timeout_s));
  timer_.async_wait([this, alive = alive_](const boost::system::error_code& ec) {
    if (ec || !*alive || phase_ != Phase::kTerminating) return;
    for (auto& w : workers_)
      if (w.alive)
        spdlog::warn("rank {} (pid {}) still running {} s after the stop signal; sending SIGKILL",
                     w.info.rank, w.info.pid, options_.term_timeout_s);
    kill_now();
  });
  check_progress();
}

void Attempt::kill_all() {
  // The cgroup first: it also holds what left the workers' groups.
  if (setup_.cgroup && !setup_.cgroup->kill_all())
    spdlog::warn("cannot kill the job cgroup {}: {}", setup_.cgroup->path(), strerror(errno));
  signal_groups(SIGKILL);
}

void Attempt::kill_now() {
  phase_ = Phase::kKilled;
  pumps_lossy();
  kill_all();
  timer_.expires_after(kKillDeadline);
  timer_.async_wait([this, alive = alive_](const boost::system::error_code& ec) {
    if (ec || !*alive || phase_ != Phase::kKilled) return;
    for (auto& w : workers_)
      if (w.alive) {
        spdlog::error("rank {} (pid {}) did not exit {} s after SIGKILL; giving up on it",
                      w.info.rank, w.info.pid, kKillDeadline.count());
        w.alive = false;
      }
    check_progress();
  });
  check_progress();
}

bool Attempt::pumps_open() const {
  for (const auto& w : workers_)
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
  all_reaped();
}

void Attempt::all_reaped() {
  if (workers_.empty()) return;
  phase_ = Phase::kDraining;
  // Whatever the workers left behind (in the job cgroup, their groups or
  // re-parented to us, the subreaper) ends with the attempt.
  kill_all();
  if (setup_.cgroup &&
      !setup_.cgroup->kill_and_wait(Clock::now() + kSweepDeadline))
    spdlog::warn("processes in {} outlived SIGKILL for {} s", setup_.cgroup->path(),
                 kSweepDeadline.count());
  sweep_descendants({guardian_.pid()}, Clock::now() + kSweepDeadline);
  timer_.expires_after(kDrainDeadline);
  timer_.async_wait([this, alive = alive_](const boost::system::error_code& ec) {
    if (ec || !*alive || phase_ != Phase::kDraining) return;
    finish();
  });
  if (!pumps_open()) finish();
}

void Attempt::finish() {
  if (phase_ == Phase::kDone) return;
  phase_ = Phase::kDone;
  timer_.cancel();
  if (setup_.stdin_forwarder) setup_.stdin_forwarder->clear_target();
  for (auto& w : workers_) {
    if (w.out) w.out->close();
    if (w.err) w.err->close();
    guardian_.remove_group(w.info.pid);
  }
  if (result_.root && result_.root->local_rank) {
    int lr = *result_.root->local_rank;
    if (lr >= 0 && lr < static_cast<int>(workers_.size()))
      result_.root->error = read_error_file(workers_[lr].info.error_file);
  }
  for (auto* h : hooks_) h->attempt_ended(result_);
}

}  // namespace ddprun::agent
