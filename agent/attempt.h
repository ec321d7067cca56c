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
// With --restart-scope=rank (attempt_recovery.cc, docs/RECOVERY.md) each
// worker also gets a recovery channel, and a failed or hung worker in the
// running phase is replaced alone while restarts are left: the generation
// goes up, the survivors are told (failed, then ready), the replacement
// starts in the same slot, and the recovery is over once every local rank
// has joined the generation. A second failure before that, no restart
// left, a spawn that fails or --recovery-timeout passing falls back to the
// group teardown above. With --standby-workers (attempt_standby.cc) the
// attempt also starts that many rank-less standby workers after the group;
// a replacement is then a standby told its rank (event=assign) rather than
// a process started at the failure, and another standby starts once the
// recovery is over. A standby is no rank: its death before assignment is
// one console line, not a failure; it ends with the attempt. On several
// nodes (attempt_peers.cc) the agents keep the generation in step through
// the store (peer_recovery.h): the failing node opens it, every other node
// tells its survivors (nothing is replaced there), and the recovery is over
// once every node's ranks have joined.
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
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "agent/attempt_types.h"
#include "agent/hooks.h"
#include "agent/options.h"
#include "agent/output_pump.h"
#include "agent/peer_recovery.h"
#include "agent/process_launcher.h"
#include "agent/recovery_channel.h"
#include "agent/stdin_forwarder.h"
#include "base/clock.h"
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

class Attempt : public AttemptControl {
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
  // (5 ms without the pipe check: the whole of a restart's 7 ms.)
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

  struct Worker {
    WorkerInfo info;
    bool alive = false;
    // Its exec failed (reaped by ProcessLauncher::finish): no group to signal.
    bool never_ran = false;
    // Rank scope: this hung worker is being killed for a replacement; its
    // end starts the replacement.
    bool replacing = false;
    std::unique_ptr<OutputPump> out;
    std::unique_ptr<OutputPump> err;
    std::unique_ptr<RecoveryChannel> channel;  // rank scope only
    // --standby-workers: its DDPRUN_STANDBY number while (or since) it was a
    // standby; 0 for a worker started as a rank. A standby's info.rank and
    // info.local_rank are -1 until it is assigned a slot.
    int standby = 0;
    // The local rank its output and packets are reported under (the hooks,
    // on_packet): -1 while a standby, set when it is assigned a slot.
    std::shared_ptr<int> slot;
    // Its prefix for console lines.
    std::string prefix;
  };

  // Rank scope: the recovery under way (at most one).
  struct Recovery {
    int generation = 0;
    int local_rank = 0;  // the slot being replaced; -1: none (another node's ranks)
    // The failed global ranks: the slot's, or another node's (maybe several).
    std::vector<int> ranks;
    // Several nodes: every local rank joined; the other nodes' are awaited.
    bool joined_here = false;
    std::string cause;   // "exit" or "hang"
    base::TimePoint began{};
    std::set<int> joined;  // local ranks that joined `generation`
    bool spawned = false;  // the replacement exists
    bool from_standby = false;  // ... and was a standby (event=assign)
    // What failed, the root cause should the recovery fall back.
    Failure failure;
  };

  // attempt_spawn.cc: one worker, its log folder, environment and pumps.
  // kReplacement: a rank-scope replacement in an existing slot (its log
  // files are appended to, not truncated). kStandby: `local_rank` is the
  // standby's number; no rank, its own log folder (standby_<n>/).
  enum class SpawnKind { kGroup, kReplacement, kStandby };
  Worker spawn_worker(int local_rank, SpawnKind kind = SpawnKind::kGroup);
  // Creates <log_dir>/<leaf>/ and names the worker's error file.
  std::string make_worker_dir(WorkerInfo& w, const std::string& leaf);
  EnvMap worker_env(const WorkerInfo& w, int recovery_fd, int standby) const;

  // attempt_recovery.cc: --restart-scope=rank.
  bool rank_scope() const { return options_.restart_scope == RestartScope::kRank; }
  int restarts_left() const;
  // A worker ended in the running phase: true when rank recovery took care
  // of it (a replacement is starting), false for the group path.
  bool recover_exit(Worker& w, const WorkerEnd& end);
  // A hook's fail_attempt with replace_local_rank: true when the rank is
  // being replaced, false for the group path.
  bool recover_hang(const FailRequest& request);
  void begin_recovery(int local_rank, const std::string& cause, const std::string& what,
                      Failure failure);
  void respawn(int local_rank);
  // The replacement in `local_rank`'s slot exists (spawned or assigned):
  // the hooks' kReplaced, `ready` to the survivors.
  void replaced(int local_rank, const WorkerInfo& old);

  // attempt_standby.cc: --standby-workers.
  // Starts standbys until options_.standby_workers are alive, where a
  // recovery could still use one (a restart left, the losses budget).
  void start_standbys();
  // Gives a live standby `local_rank`'s slot (event=assign); false when
  // none is there (the caller spawns).
  bool assign_standby(int local_rank, const WorkerInfo& old);
  // A reaped child that was a standby: one line, maybe another standby;
  // false when `pid` is not a standby's.
  bool standby_exited(pid_t pid, int wait_status);
  // Every rank has ended: the standbys are SIGKILLed (they hold no state);
  // true while one is alive.
  bool standbys_left();
  void on_packet(int local_rank, std::string_view packet);
  void check_joined();
  // Every rank (of every node) joined: `recovered` to the ranks, the hooks.
  void recovery_complete();
  // The generation just opened (generation_): `failed` naming `ranks` to
  // every live worker but `except`, the hooks' kFailed, --recovery-timeout.
  void announce_failure(const std::vector<int>& ranks, int except, const std::string& line);
  // Falls back, with `root` as the attempt's failure, and stops the group.
  void give_up(const std::string& reason, const std::string& why, Failure root);

  // attempt_peers.cc: rank scope on several nodes (peer_recovery.h).
  bool multi_node() const;
  void start_peers();
  void peer_failed(const rendezvous::RankFailure& failure);
  void generation_published(int64_t generation, bool opened);
  void generation_formed(int64_t generation);
  void peers_lost(const std::string& why);
  // Gives up on rank recovery: the fallback message to every worker, one
  // console line, the event; the caller starts the group path.
  void fall_back(const std::string& reason, const std::string& why);
  // Sends `packet` to every live worker but `except` (a local rank).
  void tell_workers(const std::string& packet, int except = -1);
  void recovery_hooks(RecoveryEvent event);
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
  std::optional<SpawnError> finish_exec(Worker& w);

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
  // Rank scope.
  int generation_ = 0;
  int rank_restarts_ = 0;  // the job's, this attempt's included
  std::optional<Recovery> recovery_;
  std::unique_ptr<base::Timer> recovery_timer_;  // --recovery-timeout
  std::unique_ptr<base::Timer> victim_timer_;    // a hung rank's traceback wait, then SIGKILL
  std::unique_ptr<PeerRecovery> peers_;          // several nodes only
  std::vector<Worker> retired_;  // replaced workers: their pumps drain to EOF
  std::vector<Worker> standbys_;  // --standby-workers: not yet assigned
  int standbys_started_ = 0;      // numbers them (DDPRUN_STANDBY)
  int standbys_lost_ = 0;         // died before assignment
  bool standbys_stopping_ = false;  // SIGKILLed at the end: their exits are quiet
  AttemptResult result_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace ddprun::agent
