// One attempt: a worker group started, watched and torn down on the agent's
// event loop.
//
// Life cycle: start() spawns every worker; exits arrive through on_exit()
// (the agent's SIGCHLD reaper dispatches them). A worker's failure first
// leaves the others kFailureDrain to end on their own. Then the failure, a signal
// to the agent (interrupt) or a hook (fail_attempt) starts the teardown:
// the signal to every worker's process group, a grace period
// (--term-timeout), then SIGKILL (to the groups and the job cgroup). When
// every worker is reaped the attempt SIGKILLs what is left in the job
// cgroup, their groups and below the agent, drains the pipes, and is
// done(); result() then says how it ended.
//
// With --restart-scope=rank each worker also gets a recovery channel, and
// a failed or hung worker in the running phase is replaced alone while
// restarts are left: RankRecovery (rank_recovery.h) decides and tells the
// workers, the attempt kills and fills the slot (RecoveryHost); what makes
// that impossible falls back to the group teardown above. With
// --standby-workers the attempt also keeps that many rank-less standby
// workers (StandbyPool, standby_pool.h); a replacement is then a standby
// told its rank rather than a process started at the failure.
//
// Processes are started and signalled through a ProcessLauncher and time
// comes from a base::Clock: the agent passes the real ones, the unit tests
// a fake launcher and a ManualClock (tests/agent/attempt_test.cc).
//
// Not thread-safe; everything runs on the agent's single thread.
#pragma once

#include <sys/resource.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/attempt_types.h"
#include "agent/hooks.h"
#include "agent/options.h"
#include "agent/output_pump.h"
#include "agent/process_launcher.h"
#include "agent/rank_recovery.h"
#include "agent/standby_pool.h"
#include "agent/stdin_forwarder.h"
#include "agent/worker_process.h"
#include "agent/worker_streams.h"
#include "base/clock.h"
#include "base/liveness.h"
#include "base/scoped_fd.h"

namespace ddprun::agent {

struct AttemptSetup {
  int restart_count = 0;
  // This agent's attempt number (0, 1, ...): names the attempt_<n> log
  // folder. Equals restart_count on one node; runs ahead of it across nodes
  // after a scale-up, which starts a round without spending a restart, so
  // that round's logs do not overwrite the previous one's.
  int attempt_index = 0;
  RoundInfo round;
  std::string run_id;
  // <log root>/<run_id>_<random> (multi-node: <run_id>_<host>_<random>):
  // attempt_<n>/<local_rank>/ go below it.
  std::string run_dir;
  // The agent's private folder (runtime_dir.h), for sockets and FIFOs.
  std::string runtime_dir;
  // True with --log-dir: stdout.log and stderr.log for every worker.
  // Otherwise only redirected streams get a file.
  bool log_every_stream = false;
  EnvMap base_env;
  std::string program_path;  // resolved argv[0]
  // RLIMIT_NOFILE the workers get (see SpawnRequest::nofile_limit).
  std::optional<rlimit> worker_nofile_limit;
  // ddprun's consoles (console.h); a terminal stdout makes workers' stdout
  // and stderr pseudo-terminals.
  Consoles consoles;
  // Writes the log files off the loop; null: each pump makes its own.
  std::shared_ptr<base::QueuedWriter> log_writer;
  // Restarts spent on replacing single ranks in earlier attempts
  // (--restart-scope=rank); counted with restart_count against --max-restarts.
  int rank_restarts = 0;
  // Typed input for the stdin rank when ddprun's stdin is a terminal; null
  // otherwise (that rank then inherits ddprun's stdin).
  StdinForwarder* stdin_forwarder = nullptr;
};

class Attempt : public AttemptControl, private RecoveryHost, private StandbySpawner {
 public:
  // `io` carries the workers' output; `clock` and `launcher` must outlive
  // the attempt.
  Attempt(boost::asio::io_context& io, base::Clock& clock, ProcessLauncher& launcher,
          const Options& options, AttemptSetup setup, std::vector<AgentHooks*> hooks);
  ~Attempt() override;
  Attempt(const Attempt&) = delete;
  Attempt& operator=(const Attempt&) = delete;

  // Spawns every worker. On SpawnError the workers already started are torn
  // down (run the loop until done()) and the error is rethrown.
  void start();
  // Called for every reaped child; false when `pid` is not one of ours.
  bool on_exit(pid_t pid, int wait_status);
  // The agent got `sig`: forward it to every worker group, then grace and
  // SIGKILL. A second call kills at once.
  void interrupt(int sig);
  void fail_attempt(const FailRequest& request) override;
  void continue_running_workers() override;
  // Job control: Ctrl-Z stops every worker group (SIGSTOP, certain even
  // for a worker that handles SIGTSTP); fg/bg continue them.
  void stop_workers();
  void continue_workers();
  // The terminal was resized: every worker pty follows, with SIGWINCH.
  void resize_terminals();
  boost::asio::io_context& io() override { return io_; }

  // After a worker fails, how long the others may take to end on their own
  // (printing their tracebacks) before the stop signal: bounded, short, and
  // cut short by the last exit, a signal to the agent, or every one left
  // being idle over one kIdleSample (ProcessLauncher::idle) with nothing
  // unread in its pipes (OutputPump::unread). The pipes are what make a
  // short sample safe: a rank blocked mid-traceback on a full pipe looks
  // asleep but has bytes waiting; one formatting it uses CPU within 1 ms.
  static constexpr std::chrono::milliseconds kFailureDrain{500};
  static constexpr std::chrono::milliseconds kIdleSample{1};

  bool done() const { return phase_ == Phase::kDone; }
  const AttemptInfo& info() const { return info_; }
  // Valid once done().
  const AttemptResult& result() const { return result_; }

 private:
  enum class Phase {
    kRunning,
    kPreSignal,
    kFailureDrain,  // a worker failed: the others may still end on their own
    kTerminating,
    kKilled,
    kDraining,
    kDone
  };

  using Worker = WorkerProcess;

  // attempt_spawn.cc: one worker, its log folder, environment and pumps.
  // The worker of slot `local_rank`; a `replacement` (rank scope) goes on
  // in the slot's log files, appended to rather than truncated.
  Worker spawn_rank(int local_rank, bool replacement = false) {
    return spawn_worker(local_rank, 0, replacement);
  }
  // Standby number `number` (DDPRUN_STANDBY): no rank, no slot, its own log
  // folder (standby_<n>/).
  Worker spawn_standby(int number) override { return spawn_worker(-1, number, false); }
  // One of the two: `standby` 0 for a rank's worker, `local_rank` -1 for a
  // standby.
  Worker spawn_worker(int local_rank, int standby, bool replacement);
  // Typed input reaches the worker through the stdin forwarder.
  void forward_input(Worker& worker, WorkerStreams& streams);
  EnvMap worker_env(const WorkerInfo& w, int recovery_fd, int standby) const;

  // RecoveryHost (rank_recovery.h) and StandbySpawner (standby_pool.h).
  bool running() const override { return phase_ == Phase::kRunning; }
  int slot_count() const override { return static_cast<int>(workers_.size()); }
  const WorkerInfo& slot(int local_rank) const override { return workers_[local_rank].info; }
  bool slot_alive(int local_rank) const override { return workers_[local_rank].alive; }
  void signal_slot(int local_rank, int sig, bool whole_group) override;
  Replaced replace_slot(int local_rank, int generation) override;
  void tell_workers(const std::string& packet, int except = -1) override;
  void stop_group(Failure root) override;
  void recovery_over() override { start_standbys(); }
  void start_standbys();
  bool rank_scope() const { return recovery_.enabled(); }

  // `shown`: the stream's kStd* bit when it goes to the console, else 0.
  // `slot`: the worker's (Worker::slot), read when output arrives.
  std::unique_ptr<OutputPump> make_pump(const WorkerInfo& w, std::shared_ptr<int> slot,
                                        const std::string& prefix,
                                        Stream stream, int shown, base::ScopedFd read,
                                        base::ScopedFd log);
  void record_failure(Failure failure);
  void begin_failure_drain();
  void check_failure_drain();
  void begin_teardown(int sig);
  void signal_groups(int sig);
  void pumps_lossy();
  void kill_now();
  void kill_all();
  void check_progress();
  void all_reaped();
  void finish();
  bool pumps_open() const;
  Worker* find(pid_t pid);
  // Waits for `w`'s exec (ProcessLauncher::finish); on failure marks it as
  // never run and returns the error.
  std::optional<SpawnError> finish_exec(Worker& w) override;

  boost::asio::io_context& io_;
  base::Clock& clock_;
  ProcessLauncher& launcher_;
  const Options& options_;
  AttemptSetup setup_;
  std::vector<AgentHooks*> hooks_;
  AttemptInfo info_;
  std::vector<Worker> workers_;
  Phase phase_ = Phase::kRunning;
  bool ptys_ = false;  // worker streams are pseudo-terminals
  std::vector<int> pre_signal_targets_;  // local ranks awaited in kPreSignal
  base::TimePoint drain_until_{};        // kFailureDrain's end
  // The phase's deadline: pre-signal wait, grace, kill, drain.
  std::unique_ptr<base::Timer> timer_;
  RankRecovery recovery_;        // --restart-scope=rank
  std::vector<Worker> retired_;  // replaced workers: their pumps drain to EOF
  StandbyPool standbys_;         // --standby-workers
  AttemptResult result_;
  base::Liveness alive_;
};

}  // namespace ddprun::agent
