#include "agent/agent.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include "agent/exit_status.h"
#include "base/fd_limit.h"
#include "base/off_loop_task.h"
#include "agent/failure_summary.h"
#include "agent/guardian.h"
#include "agent/output_pump.h"
#include "agent/runtime_dir.h"
#include "agent/spawn.h"
#include "base/contract.h"
#include "base/safe_file.h"
#include "base/steady_clock.h"
#include "agent/standalone_rendezvous.h"

namespace ddprun::agent {
namespace {

// How long a rendezvous call abandoned by a stop signal may take to return.
constexpr std::chrono::milliseconds kAbandonWait{3000};

std::string env_value(const EnvMap& env, const char* key) {
  auto it = env.find(key);
  return it == env.end() ? "" : it->second;
}

}  // namespace

Agent::Agent(Options options, std::unique_ptr<RendezvousHandler> rendezvous,
             std::unique_ptr<RestartPolicy> policy)
    : options_(std::move(options)),
      children_(io_),
      stop_signals_(io_),
      job_control_(io_),
      rendezvous_(std::move(rendezvous)),
      policy_(policy ? std::move(policy) : std::make_unique<MaxRestartsPolicy>()),
      interpreter_hint_(options_) {
  if (options_.is_python) hooks_.push_back(&interpreter_hint_);
}

Agent::~Agent() {
  // The handler's threads (store host, keep-alive) may log until it is
  // gone; then ddprun's lines go to stderr directly again.
  rendezvous_.reset();
  if (!log_sink_) return;
  log_sink_->attach_console(nullptr);
  // agent.log: bounded like the workers' logs, then on without it.
  log_sink_->close_file(Clock::now() + std::chrono::milliseconds(pending_signal_ ? 250 : 2000));
  if (consoles_.err && !pending_signal_)
    consoles_.err->drain_until(Clock::now() + std::chrono::milliseconds(100));
}

void Agent::watch_children() {
  children_.async_wait([this](const boost::system::error_code& ec, int) {
    if (ec) return;
    reap();
    watch_children();
  });
}

void Agent::reap() {
  for (;;) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) return;
    if (current_ && current_->on_exit(pid, status)) continue;
    if (pid == guardian_pid_)
      spdlog::warn("the guardian process exited early ({}); a SIGKILLed ddprun may leave "
                   "grandchildren behind",
                   ExitStatus::from_wait(status).describe());
    // Anything else is an orphan re-parented to us: reaped, nothing more.
  }
}

void Agent::watch_signals() {
  stop_signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    if (!pending_signal_) pending_signal_ = sig;
    ++signals_seen_;
    if (current_) {
      spdlog::info("got {}; stopping the workers", signal_name(sig));
      current_->interrupt(sig);
    }
    watch_signals();
  });
}

void Agent::watch_job_control() {
  job_control_.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    if (sig == SIGTSTP) {
      suspend();
    } else if (sig == SIGCONT) {
      // bg/fg after a stop we did not see (SIGSTOP from outside), or a
      // start in the background: the stopped input may be read again.
      if (current_) current_->continue_workers();
      if (stdin_) stdin_->resume();
    } else if (sig == SIGWINCH && current_) {
      current_->resize_terminals();
    }
    watch_job_control();
  });
}

void Agent::suspend() {
  // Ctrl-Z reaches only our process group; the workers have their own.
  if (current_) current_->stop_workers();
  for (auto* h : hooks_) h->job_stopped();
  // Raw passthrough ends before the stop: the shell gets its terminal back
  // as it gave it; resume() makes it raw again if a readline still waits.
  if (stdin_) stdin_->before_stop();
  // Stop as the terminal meant us to (SIGTSTP's default action, so the shell
  // says "Stopped"); the kernel discards it in an orphaned process group
  // (no parent in another group of our session), so there SIGSTOP.
  struct sigaction dfl {}, old {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGTSTP, &dfl, &old);
  pid_t parent = getppid();
  bool orphaned = getsid(parent) != getsid(0) || getpgid(parent) == getpgrp();
  raise(orphaned ? SIGSTOP : SIGTSTP);  // returns once fg/bg continued us
  sigaction(SIGTSTP, &old, nullptr);
  if (current_) current_->continue_workers();
  for (auto* h : hooks_) h->job_continued();
  if (stdin_) stdin_->resume();
}

void Agent::print(const std::string& text) { consoles_.err->write(nullptr, text); }

void Agent::drain_consoles() {
  // What is queued still goes out, unless ddprun is stopping (a stop signal:
  // 250 ms more at most, the promise is --term-timeout plus a fraction) or
  // the console has taken nothing for 60 s.
  using std::chrono::milliseconds;
  auto queued = [&] {
    return consoles_.out->bytes_queued() +
           (consoles_.err != consoles_.out ? consoles_.err->bytes_queued() : 0);
  };
  auto now = Clock::now();
  auto last_progress = now;
  std::optional<Clock::time_point> stop_by;
  size_t written = consoles_.out->bytes_written() + consoles_.err->bytes_written();
  while (queued() > 0) {
    now = Clock::now();
    if (pending_signal_ && !stop_by) stop_by = now + milliseconds(250);
    if ((stop_by && now >= *stop_by) || now - last_progress > std::chrono::seconds(60)) break;
    size_t w = consoles_.out->bytes_written() + consoles_.err->bytes_written();
    if (w != written) written = w, last_progress = now;
    io_.run_one_for(milliseconds(20));
  }
  size_t lost = queued() + consoles_.out->dropped() +
                (consoles_.err != consoles_.out ? consoles_.err->dropped() : 0);
  size_t lines = log_sink_ ? log_sink_->lines_not_shown() : 0;
  if (lost == 0 && lines == 0) return;
  // Never through the logger: it would count this line instead.
  std::string what;
  if (lost > 0) what = std::to_string(lost) + " bytes of the workers' output";
  if (lines > 0)
    what += (what.empty() ? "" : " and ") + std::to_string(lines) + " of ddprun's own lines";
  std::string msg = "ddprun: the console did not take " + what +
                    (options_.log_dir.empty() ? "" : " (the log files under --log-dir have them)") +
                    "\n";
  consoles_.err->write(nullptr, msg);
  consoles_.err->drain_until(Clock::now() + milliseconds(100));
}

void Agent::run_until(const std::function<bool()>& done) {
  while (!done()) io_.run_one();
}

template <class T>
T Agent::off_loop(std::function<T()> call) {
  // The call blocks on other nodes (a join, the exit barrier): a task of its
  // own (base/off_loop_task.h), while the loop goes on serving signals,
  // children and output. A stop signal that arrives meanwhile abandons it
  // (the handler cancels its store connections), so it returns within
  // milliseconds, unless it sits where nothing cancels it (getaddrinfo on
  // a resolver that does not answer): past kAbandonWait ddprun goes on
  // without it. The call then runs on after this frame and perhaps after
  // the Agent: it captures by value, its outcome lives in a shared_ptr, and
  // the handler it uses is leaked (never destroyed) rather than freed under
  // it. What that costs: the handler's farewell to the other nodes (they
  // learn of this node from its missing heartbeats instead).
  struct Outcome {
    std::optional<T> value;
    std::exception_ptr error;
  };
  auto outcome = std::make_shared<Outcome>();
  bool done = false;  // on the loop only; `done` is never run after abandon()
  const int signals_before = signals_seen_;
  base::OffLoopTask task;
  task.start(
      [call = std::move(call), outcome](const base::OffLoopTask::Token&) {
        try {
          outcome->value.emplace(call());
        } catch (...) {
          outcome->error = std::current_exception();
        }
      },
      [this](std::function<void()> f) { boost::asio::post(io_, std::move(f)); },
      [&done] { done = true; });
  run_until([&] { return done || signals_seen_ != signals_before; });
  if (!done) {
    rendezvous_->abandon(pending_signal_);
    const auto by = Clock::now() + kAbandonWait;
    while (!done && Clock::now() < by) io_.run_one_until(by);
  }
  if (!done || !task.join_until(Clock::now() + kAbandonWait)) {
    spdlog::warn("the rendezvous call did not end within {} s of {} (a name lookup cannot be "
                 "cancelled); exiting without it",
                 std::chrono::duration_cast<std::chrono::seconds>(kAbandonWait).count(),
                 signal_name(pending_signal_));
    task.abandon();
    (void)rendezvous_.release();  // still in use by the abandoned call: leaked, never freed
    throw std::runtime_error("the rendezvous call was abandoned");
  }
  if (outcome->error) std::rethrow_exception(outcome->error);
  return std::move(*outcome->value);
}

RoundInfo Agent::next_round(int restart) {
  if (options_.max_nodes <= 1) return rendezvous_->next_round(restart);
  return off_loop<RoundInfo>(
      [handler = rendezvous_.get(), restart] { return handler->next_round(restart); });
}

GroupVerdict Agent::group_ended(GroupOutcome outcome) {
  if (options_.max_nodes <= 1) return rendezvous_->group_ended(outcome);
  return off_loop<GroupVerdict>(
      [handler = rendezvous_.get(), outcome] { return handler->group_ended(outcome); });
}

std::string Agent::make_run_dir(const EnvMap& env, bool keep) {
  std::string root = options_.log_dir;
  if (root.empty()) {
    // No --log-dir: error files (and nothing else) in the agent's private
    // folder, removed with it; redirected output must outlive the job, so it
    // gets a kept folder of its own.
    root = keep ? make_temp_dir(temp_bases(env), "ddprun_logs.") : runtime_->path() + "/logs";
  }
  // The log root: walked and checked by base::SafeDir (owner us or root,
  // no foreign symlink, not writable by others unless sticky); the run
  // folder is then made below its descriptor, 0700, under a random name.
  base::SafeDir logs = base::SafeDir::open(root, true, 0755);
  // Every run its own folder, never reused (torchrun's <run_id>_<random>),
  // so a second run or a concurrent job with the same --rdzv-id keeps its
  // own logs and events.jsonl. Across nodes the host goes in the name too:
  // nodes sharing one log folder (NFS) keep every node's files, findable by
  // node.
  auto safe = [](std::string s) {
    for (char& c : s)
      if (c == '/' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '_';
    return s;
  };
  std::string name = safe(rendezvous_->run_id());
  if (options_.max_nodes > 1) name += "_" + safe(options_.hostname);
  std::string leaf;
  logs.make_unique_subdir(name + "_", 0700, &leaf);
  return (root.back() == '/' ? root : root + "/") + leaf;
}

void Agent::make_cgroup(EnvMap& worker_env) {
  std::string why = std::string(base::kEnvCgroup) + "=off";
  if (env_value(worker_env, base::kEnvCgroup) != "off") cgroup_ = JobCgroup::create(&why);
  if (cgroup_) return;
  // Once, at start-up: without a cgroup, what leaves the workers' process
  // groups is found by ancestry while ddprun lives and by an environment
  // token after it is SIGKILLed (guardian.h).
  spdlog::info("no job cgroup ({}); teardown uses process groups instead", why);
  worker_env[base::kEnvContainmentToken] = base::random_hex(16);
}

int Agent::run() {
  try {
    return run_all();
  } catch (...) {
    // An exception may end the process without unwinding (none catches it
    // above): the terminal's modes go back first (raw passthrough).
    stdin_.reset();
    throw;
  }
}

int Agent::run_all() {
  // Orphaned grandchildren come to us, so we can reap and kill them.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  // A closed console must not kill the agent; write() errors are handled.
  signal(SIGPIPE, SIG_IGN);
  // Pipes, logs and store connections scale with the workers: take the
  // hard limit, as ddprun-store does. Workers get the soft limit ddprun
  // was started with, as under torchrun, since programs that select() on
  // descriptors (FD_SETSIZE 1024) may rely on it.
  worker_nofile_limit_ = base::raise_fd_limit().before;
  consoles_ = open_consoles(io_);
  if (log_sink_) log_sink_->attach_console(consoles_.err);
  base::QueuedWriter::Options files;
  files.on_error = [](const std::string& what) { spdlog::warn("log files: {}", what); };
  log_files_ = std::make_shared<base::QueuedWriter>(std::move(files));
  if (options_.stdin_rank >= 0 && isatty(STDIN_FILENO)) {
    try {
      stdin_ = std::make_unique<StdinForwarder>(io_, STDIN_FILENO, [this] {
        // The terminal echoed the line: a prompt's open line has ended there.
        for (auto* c : {consoles_.out.get(), consoles_.err.get()})
          if (c->terminal()) c->line_typed();
      });
      // In the background the terminal answers EIO instead of stopping us.
      signal(SIGTTIN, SIG_IGN);
      stdin_->start();
    } catch (const std::exception& e) {
      spdlog::warn("typed input is not forwarded to rank {}: {}", options_.stdin_rank, e.what());
    }
  }
  children_.add(SIGCHLD);
  for (int sig : options_.signals_to_handle) stop_signals_.add(sig);
  for (int sig : {SIGTSTP, SIGCONT, SIGWINCH}) job_control_.add(sig);
  watch_children();
  watch_signals();
  watch_job_control();
  EnvMap env = env_from_strings(options_.base_env);
  make_cgroup(env);
  auto token = env.find(base::kEnvContainmentToken);
  std::optional<Guardian> guardian;
  try {
    guardian.emplace(cgroup_ ? cgroup_->path() : "",
                     token == env.end() ? "" : token->first + "=" + token->second);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  guardian_pid_ = guardian->pid();
  int status = run_job(*guardian, std::move(env));
  cgroup_.reset();  // before the guardian: the agent removes it, not the safety net
  if (options_.max_nodes > 1 && rendezvous_ && !pending_signal_) {
    // The exit hand-shake waits on other nodes: off the loop, so a stop
    // signal still ends ddprun at once.
    try {
      off_loop<bool>([handler = rendezvous_.get()] {
        handler->finish_job();
        return true;
      });
    } catch (const std::exception&) {
      if (!pending_signal_) throw;  // abandoned after a stop signal: said above
    }
    if (pending_signal_) {
      spdlog::warn("got {} while the other nodes were reading the job's outcome; exiting",
                   signal_name(pending_signal_));
      status = 128 + pending_signal_;
    }
  }
  if (!log_errors_.empty()) {
    std::string text = "ddprun: " + std::to_string(log_errors_.size()) +
                       " log file(s) could not be written; their output went to the console:\n";
    for (const auto& e : log_errors_) text += "  " + e + "\n";
    print(text);
  }
  // The workers' log files: a folder that stopped taking bytes (NFS) must
  // not hold the exit; past the deadline the line says what they lack.
  const std::string unwritten =
      log_files_->close(Clock::now() + std::chrono::milliseconds(pending_signal_ ? 250 : 5000));
  if (!unwritten.empty()) print("ddprun: log files: " + unwritten + "\n");
  drain_consoles();
  return status;
}

}  // namespace ddprun::agent
