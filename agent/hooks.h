// Seams for the components that watch workers (the hang watchdog, a
// multi-node rendezvous): the agent calls AgentHooks at each step of an
// attempt, and hands out an AttemptControl to end the attempt early.
//
// All calls happen on the agent's single event-loop thread; hooks must not
// block. A hook that needs timers or sockets uses AttemptControl::io().
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "agent/attempt_types.h"
#include "agent/worker_env.h"

namespace ddprun::agent {

enum class Stream { kStdout, kStderr };

// Asks the running attempt to fail with a custom reason.
struct FailRequest {
  // Shown as the root cause, e.g. "hang: rank 1 missed heartbeats for 5 s".
  std::string reason;
  // The local rank it concerns, if any (its log path goes in the summary).
  std::optional<int> local_rank;
  // ddprun's exit status if this failure ends the job.
  int exit_code = 1;
  // When non-zero, first send this signal (e.g. SIGABRT, for a stack dump) to
  // `targets` and wait until they exit or `wait` passes (output keeps being
  // drained meanwhile); then the normal SIGTERM-grace-SIGKILL teardown.
  int signal = 0;
  std::vector<int> targets;  // local ranks; empty means every worker
  std::chrono::milliseconds wait{5000};
  // --restart-scope=rank: the local rank to blame and replace (a hang's
  // culprit). The attempt then sends `signal` to that rank alone (when it
  // is among `targets`), SIGKILLs its group after `wait` and starts a
  // replacement, where a restart is left and no recovery is under way;
  // otherwise it falls back to the above. Ignored with group scope.
  std::optional<int> replace_local_rank;
};

class AttemptControl {
 public:
  virtual ~AttemptControl() = default;
  // Ignored when the attempt is already ending; the first failure wins.
  virtual void fail_attempt(const FailRequest& request) = 0;
  // SIGCONT to the process group of each worker still running (not reaped
  // yet, so its pid still names its group): a stopped worker then acts on
  // a pre-signal or the teardown at once instead of at SIGKILL.
  virtual void continue_running_workers() = 0;
  virtual boost::asio::io_context& io() = 0;
};

class AgentHooks {
 public:
  virtual ~AgentHooks() = default;
  // Before spawning each worker: add or change variables in `env`.
  virtual void add_worker_env(const AttemptInfo& attempt, int local_rank, EnvMap& env) {
    (void)attempt, (void)local_rank, (void)env;
  }
  // Every worker of the attempt is running. `control` stays valid until
  // attempt_ended.
  virtual void workers_started(const AttemptInfo& attempt, AttemptControl& control) {
    (void)attempt, (void)control;
  }
  // A worker wrote to a stream (raw bytes, as read; not split into lines).
  virtual void output(int local_rank, Stream stream, std::string_view data) {
    (void)local_rank, (void)stream, (void)data;
  }
  virtual void worker_exited(const WorkerEnd& end) { (void)end; }
  // A worker's log file could not be written (`error`: errno's text); once per
  // file. Its output still reaches the console.
  virtual void log_write_failed(int local_rank, const std::string& path,
                                const std::string& error) {
    (void)local_rank, (void)path, (void)error;
  }
  // Job control: ddprun and every worker were stopped (Ctrl-Z), then
  // continued (fg/bg). Time in between is nobody's hang.
  virtual void job_stopped() {}
  virtual void job_continued() {}
  // The attempt's root cause, once, as soon as it is known (before the
  // teardown): a worker's failure, a hook's fail_attempt, a spawn error.
  virtual void attempt_failed(const Failure& root) { (void)root; }
  // ddprun got `signal` and is stopping the workers (once per attempt).
  virtual void attempt_interrupted(int signal) { (void)signal; }
  // --restart-scope=rank: a step of a rank's recovery (attempt_types.h).
  // With kReplaced, the replaced worker's slot has the new pid from now on.
  virtual void recovery(const RecoveryEvent& event) { (void)event; }
  // Every process of the attempt is gone.
  virtual void attempt_ended(const AttemptResult& result) { (void)result; }
};

}  // namespace ddprun::agent
