// The node agent: runs attempts of the worker group until one succeeds, a
// signal stops the job, or the restart policy gives up; returns ddprun's
// exit status.
//
// One Boost.Asio io_context on one thread carries everything: SIGCHLD (every
// exited child is reaped with waitpid(-1, WNOHANG) and handed to the running
// attempt; other children, orphans re-parented to the subreaper agent, are
// simply reaped), the handled signals, pipe output and timers. Nothing polls.
// Waits on other nodes (a multi-node join, the exit barrier) run on a thread
// of their own and post back (off_loop, base/off_loop_task.h); a stop
// signal meanwhile abandons them through RendezvousHandler::abandon, so
// ddprun exits at once (a call stuck where nothing cancels it, getaddrinfo,
// is left behind after 3 s). Console output is queued to writer threads
// (console.h), so a console nobody reads slows the workers, never the loop;
// the log files are written by base::QueuedWriter's thread (bounded).
//
// Containment: the workers run in a job cgroup of their own where one can be
// made (job_cgroup.h), watched over by the guardian (guardian.h), so that
// nothing they start outlives the job, even when ddprun is SIGKILLed.
//
// Exit status: 0 on success; the root cause's status (exit code, or 128+N
// for signal N) when the job fails; 128+N when ddprun receives signal N;
// 127/126 when the program is not found / cannot be executed; 1 for
// ddprun's own failures (rendezvous, pipes, log files, fd limits).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "agent/attempt.h"
#include "agent/console.h"
#include "agent/stdin_forwarder.h"
#include "agent/hooks.h"
#include "agent/interpreter_hint.h"
#include "agent/job_cgroup.h"
#include "agent/log_sink.h"
#include "agent/runtime_dir.h"
#include "agent/options.h"
#include "agent/rendezvous_handler.h"
#include "agent/restart_policy.h"
#include "base/queued_writer.h"
#include "base/steady_clock.h"

namespace ddprun::agent {

class Agent {
 public:
  // `rendezvous` null: StandaloneRendezvous; `policy` null: MaxRestartsPolicy.
  // Hooks are not owned and must outlive run().
  explicit Agent(Options options, std::unique_ptr<RendezvousHandler> rendezvous = nullptr,
                 std::unique_ptr<RestartPolicy> policy = nullptr);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  void add_hooks(AgentHooks* hooks) { hooks_.push_back(hooks); }
  // The sink of spdlog's default logger (log_sink.h): while run() runs,
  // ddprun's own lines go through the console's writer thread, and with
  // --log-dir to <run folder>/ddprun.log too. Not set: straight to stderr.
  void set_log_sink(std::shared_ptr<LogSink> sink) { log_sink_ = std::move(sink); }
  boost::asio::io_context& io() { return io_; }

  // Runs the job to the end; returns ddprun's exit status.
  int run();

 private:
  int run_all();
  void watch_children();
  void watch_signals();
  void watch_job_control();
  void suspend();
  void print(const std::string& text);
  void drain_consoles();
  void reap();
  void run_until(const std::function<bool()>& done);
  int run_job(Guardian& guardian, EnvMap env);
  // What follows an attempt: ddprun's exit status, or none and the wait
  // before the next attempt.
  struct NextStep {
    std::optional<int> exit_status;
    std::chrono::milliseconds delay{0};
  };
  // Each returns ddprun's exit status when the job ends there.
  std::optional<int> prepare_job(AttemptSetup& setup, EnvMap env);
  std::optional<int> join_round(AttemptSetup& setup, int restart);
  // Runs the attempt until done(); false when its workers could not all be
  // spawned.
  bool run_attempt(Attempt& attempt);
  NextStep after_attempt(const AttemptResult& result, bool spawned, int restart);
  // The restart back-off; a stop signal ends it early.
  void back_off(std::chrono::milliseconds delay);
  void make_cgroup(EnvMap& worker_env);
  // The runtime folders and job cgroups of SIGKILLed agents; once.
  void remove_leftovers_of_dead_agents();
  // `call` runs on an OffLoopTask; it must capture by value (it may be left
  // running past a stop signal, see the definition).
  template <class T>
  T off_loop(std::function<T()> call);
  RoundInfo next_round(int restart);
  GroupVerdict group_ended(GroupOutcome outcome);
  std::string make_run_dir(const EnvMap& env, bool keep);
  // `result` for the failure summary, its root cause's error file copied
  // out of the private folder first when that folder holds it (no --log-dir).
  AttemptResult keep_error_file(const AttemptResult& result);
  // The failure summary with the interpreter hint, on ddprun's log.
  void print_failure(const AttemptResult& result, const std::string& verdict);

  Options options_;
  boost::asio::io_context io_;
  base::SteadyClock clock_{io_};  // attempts' deadlines, the back-off
  boost::asio::signal_set children_;
  boost::asio::signal_set stop_signals_;
  // Ctrl-Z (SIGTSTP), fg/bg (SIGCONT), a resized terminal (SIGWINCH).
  boost::asio::signal_set job_control_;
  Consoles consoles_;
  // Writes the workers' log files off the loop (base/queued_writer.h).
  std::shared_ptr<base::QueuedWriter> log_files_;
  std::shared_ptr<LogSink> log_sink_;
  std::unique_ptr<StdinForwarder> stdin_;
  // Log files that failed during the job, repeated at its end.
  std::vector<std::string> log_errors_;
  std::unique_ptr<RendezvousHandler> rendezvous_;
  std::unique_ptr<RestartPolicy> policy_;
  std::vector<AgentHooks*> hooks_;
  InterpreterHint interpreter_hint_;  // the first hook: sees every output
  Attempt* current_ = nullptr;
  int pending_signal_ = 0;  // the first stop signal
  int signals_seen_ = 0;    // stop signals so far
  pid_t guardian_pid_ = -1;
  std::unique_ptr<JobCgroup> cgroup_;  // null: process-group fallback
  std::optional<rlimit> worker_nofile_limit_;
  // This agent's private folder (runtime_dir.h); removed at exit.
  std::unique_ptr<RuntimeDir> runtime_;
  // Where kept folders go ($TMPDIR, /tmp: runtime_dir.h's temp_bases).
  std::vector<std::string> temp_bases_;
  // Runtime bases still to clear of dead agents' folders (runtime_dir.h).
  std::vector<std::string> stale_bases_;
  // Said once the first workers run (prepare_job sets it): no console
  // line, so no console thread, before them.
  bool tell_omp_default_ = false;
};

}  // namespace ddprun::agent
