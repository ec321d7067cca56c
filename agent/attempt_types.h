// What the agent tells hooks, policies and the failure summary about an
// attempt: plain values, copied freely.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "agent/error_file.h"
#include "agent/exit_status.h"
#include "agent/rendezvous_handler.h"

namespace ddprun::agent {

using Clock = std::chrono::steady_clock;

struct WorkerInfo {
  int local_rank = 0;
  int rank = 0;  // global rank
  pid_t pid = -1;  // also its process group id
  bool is_python = false;
  std::string stdout_log;  // empty when the stream has no file
  std::string stderr_log;
  std::string error_file;  // TORCHELASTIC_ERROR_FILE
};

// "rank R (local rank L, pid P)", as messages name a worker.
inline std::string worker_name(const WorkerInfo& w) {
  return "rank " + std::to_string(w.rank) + " (local rank " + std::to_string(w.local_rank) +
         ", pid " + std::to_string(w.pid) + ")";
}

struct AttemptInfo {
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT of this attempt
  RoundInfo round;
  std::string log_dir;  // <run folder>/attempt_<n>
  // The agent's private folder (0700, removed at exit; runtime_dir.h): the
  // place for sockets and FIFOs, never the possibly shared log folder.
  std::string runtime_dir;
  std::vector<WorkerInfo> workers;
};

struct WorkerEnd {
  WorkerInfo worker;
  ExitStatus status;
  Clock::time_point when;
};

// Why an attempt failed: a worker's exit, or a hook's reason (a hang).
struct Failure {
  std::string reason;                 // empty for a plain worker failure
  std::optional<int> local_rank;      // the worker it concerns, if any
  std::optional<ExitStatus> status;   // set for a worker's own failure
  int exit_code = 1;                  // ddprun's exit status if this ends the job
  std::optional<ErrorReport> error;   // the worker's error file, if written
  Clock::time_point when;
};

// --restart-scope=rank: a step of one recovery (docs/RECOVERY.md), as the
// hooks see it (the watchdog follows the replacement, events.jsonl).
struct RecoveryEvent {
  enum class Kind {
    kFailed,    // ranks failed: the generation went up, the survivors were told
    kReplaced,  // the replacement was spawned (`replacement`)
    kJoined,    // every local rank joined the generation: the recovery is over
    kFallback,  // gave up: the group restart follows (`reason`)
  };
  Kind kind = Kind::kFailed;
  int generation = 0;
  std::vector<int> ranks;   // global ranks concerned
  std::string cause;        // kFailed: "exit" or "hang"
  std::string reason;       // kFallback: one word (second_failure, ...)
  std::string detail;       // for people: the console line's text
  int restarts_left = 0;    // of --max-restarts, after this step
  std::optional<WorkerInfo> replacement;  // kReplaced: the new process
  std::optional<WorkerInfo> replaced;     // kReplaced: the process it replaced
  // kReplaced: the replacement was pre-started standby number `standby`
  // (--standby-workers), assigned the slot; 0: spawned at the failure.
  int standby = 0;
};

enum class Outcome { kSucceeded, kFailed, kInterrupted };

struct AttemptResult {
  Outcome outcome = Outcome::kSucceeded;
  int restart_count = 0;
  // Restarts the job spent on replacing single ranks (--restart-scope=rank),
  // this attempt's and the earlier ones': the policy counts them with
  // restart_count against --max-restarts.
  int rank_restarts = 0;
  std::optional<Failure> root;   // kFailed: the first failure by monotonic time
  int signal = 0;                // kInterrupted: the signal ddprun received
  std::vector<WorkerEnd> ends;   // every worker, in the order they ended
  // "<path>: <error>" for every log file that could not be written (full
  // disk, quota): its stream went on to the console.
  std::vector<std::string> log_errors;
};

}  // namespace ddprun::agent
