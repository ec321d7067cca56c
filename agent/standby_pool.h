// --standby-workers (rank scope only, docs/RECOVERY.md): pre-started
// workers without a rank that take a failed rank's slot.
//
// A replacement started at the failure spends its start-up (a LibTorch
// program: loading the library, building the model) while the survivors
// wait; a standby has done that before. It starts with the group (after
// it: its start-up competes with theirs for nothing that matters), gets a
// recovery channel and DDPRUN_STANDBY=<n> but no RANK or LOCAL_RANK, and
// waits on its channel. At a failure, once the failed rank's group is
// SIGKILLed, a standby gets `event=assign` (rank, local rank, generation)
// and from then on is that slot's worker, the attempt's. Another standby
// starts when the recovery is over, not during it.
//
// A standby is nobody's rank: no heartbeat deadline, no hooks' output or
// exit before it is assigned; its death before assignment is one console
// line, and another starts while a recovery could still use one (a restart
// left) and fewer than --max-restarts + --standby-workers were lost (a
// standby that always dies must not loop). When every rank has ended the
// standbys are SIGKILLed: they hold no state.
//
// Not thread-safe: everything runs on the agent's loop.
#pragma once

#include <sys/types.h>

#include <optional>
#include <vector>

#include "agent/options.h"
#include "agent/process_launcher.h"
#include "agent/spawn.h"
#include "agent/worker_process.h"

namespace ddprun::agent {

// How the pool starts a standby: the attempt's spawning.
class StandbySpawner {
 public:
  virtual ~StandbySpawner() = default;
  // Standby number `number`, forked; throws SpawnError.
  virtual WorkerProcess spawn_standby(int number) = 0;
  // Waits for its exec; the error when it failed (it never ran).
  virtual std::optional<SpawnError> finish_exec(WorkerProcess& w) = 0;
};

class StandbyPool {
 public:
  // `options`, `launcher` and `spawner` must outlive the pool.
  StandbyPool(const Options& options, ProcessLauncher& launcher, StandbySpawner& spawner)
      : options_(options), launcher_(launcher), spawner_(spawner) {}

  // Starts standbys until options.standby_workers are alive, where a
  // recovery could still use one (`restarts_left`, the losses budget).
  // `generation` says whether this is the attempt's start.
  void refill(int restarts_left, int generation);
  // A live standby told it is `rank` in slot `local_rank` of `generation`
  // (event=assign), renamed for its console lines; nullopt when none could
  // be told (the caller starts a process).
  std::optional<WorkerProcess> assign(int local_rank, int rank, int generation);
  // `pid` ended: false when it is not a live standby. While the group
  // `running`, one line and maybe another standby (not during a recovery:
  // `recovering`).
  bool on_exit(pid_t pid, int wait_status, bool running, int restarts_left, bool recovering);
  // Every rank has ended: SIGKILLs the standbys (they hold no state), once;
  // true while one is not yet reaped.
  bool end();
  // No more exits will come (SIGKILL did not end them): none is waited for.
  void forget();
  // The unassigned standbys, for the attempt's signals, pumps and end.
  std::vector<WorkerProcess>& workers() { return standbys_; }
  const std::vector<WorkerProcess>& workers() const { return standbys_; }

 private:
  const Options& options_;
  ProcessLauncher& launcher_;
  StandbySpawner& spawner_;
  std::vector<WorkerProcess> standbys_;  // not yet assigned
  int started_ = 0;                      // numbers them (DDPRUN_STANDBY)
  int lost_ = 0;                         // died before assignment
  bool stopping_ = false;                // SIGKILLed at the end: their exits are quiet
};

}  // namespace ddprun::agent
