// The process seam under Attempt: everything the teardown state machine
// does to processes, behind one small interface, so its unit tests drive it
// with a fake (tests/agent/fake_launcher.h) in milliseconds, as ninja tests
// its builder with a fake command runner.
//
// Exits do not come through here: the agent reaps every child on SIGCHLD
// and hands each exit to Attempt::on_exit (agent.h), which a test calls
// itself.
//
// PosixLauncher is the real one: spawn_process (spawn.h), kill(2), the job
// cgroup (job_cgroup.h) and the guardian (guardian.h) that kills the
// registered groups should the agent die.
//
// Not thread-safe: the agent's thread only.
#pragma once

#include <sys/types.h>

#include <unordered_map>

#include "agent/spawn.h"

namespace ddprun::agent {

class Guardian;
class JobCgroup;

class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;
  // Starts a worker in a process group of its own (its pid is the group's
  // id) and keeps that group contained until release(). Throws SpawnError.
  virtual pid_t spawn(SpawnRequest request) = 0;
  // spawn() in two steps (spawn.h: start_process): start() forks and
  // returns the pid without waiting for the exec; finish(pid) waits for it
  // and throws SpawnError (the child reaped, its group released) when it
  // failed. An attempt starts every worker, then finishes each, so their
  // start-ups overlap. By default start() is the whole spawn().
  virtual pid_t start(SpawnRequest request) { return spawn(std::move(request)); }
  virtual void finish(pid_t) {}
  // Sends `sig` to one process.
  virtual void signal(pid_t pid, int sig) = 0;
  // Sends `sig` to a worker's whole process group.
  virtual void signal_group(pid_t pgid, int sig) = 0;
  // SIGKILLs what the job started outside the workers' groups (setsid
  // daemons), where that can be found without waiting: the job cgroup.
  virtual void kill_job() = 0;
  // Once every worker is reaped: SIGKILLs and waits (bounded) for whatever
  // the job left anywhere (the cgroup, orphans re-parented to the agent).
  virtual void sweep_leftovers() = 0;
  // The group is done with: no longer the guardian's to kill.
  virtual void release(pid_t pgid) = 0;
  // True while the process looks idle: its main thread asleep (state S, or
  // stopped) and no CPU time used since the previous call for it (the first
  // call only samples: false), and, when it sleeps waiting for a child (a
  // wrapper script), every child idle too. A gone or unreadable process
  // counts as idle.
  // The failure drain (attempt.h) stops waiting for ranks that all are.
  virtual bool idle(pid_t pid) = 0;
};

class PosixLauncher : public ProcessLauncher {
 public:
  // `cgroup` may be null (teardown then relies on process groups and the
  // descendant sweep). Neither is owned; both outlive the launcher.
  PosixLauncher(Guardian& guardian, JobCgroup* cgroup) : guardian_(guardian), cgroup_(cgroup) {}

  pid_t spawn(SpawnRequest request) override;
  pid_t start(SpawnRequest request) override;
  void finish(pid_t pid) override;
  void signal(pid_t pid, int sig) override;
  void signal_group(pid_t pgid, int sig) override;
  void kill_job() override;
  void sweep_leftovers() override;
  void release(pid_t pgid) override;
  bool idle(pid_t pid) override;  // /proc/<pid>/stat and /proc/<pid>/schedstat

 private:
  Guardian& guardian_;
  JobCgroup* cgroup_;
  bool process_idle(pid_t pid, int depth);  // `depth`: wrappers followed to here
  std::unordered_map<pid_t, unsigned long long> cpu_ns_;  // idle()'s last samples
  std::unordered_map<pid_t, StartedProcess> started_;      // start()ed, not yet finish()ed
};

}  // namespace ddprun::agent
