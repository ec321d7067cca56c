// Starting one worker: fork + execve of an argv vector, never a shell.
//
// The child gets its own process group (so the terminal's ctrl-c reaches
// the agent first and the agent can signal the worker and everything it
// started as one group), a parent-death SIGKILL (so a SIGKILLed agent leaves
// no worker behind), default signal dispositions and an empty signal mask,
// and its stdin/stdout/stderr on the given descriptors. With a job cgroup it joins the
// cgroup before exec (job_cgroup.h), so nothing it runs starts outside. An
// exec failure comes back through a close-on-exec pipe and is thrown as
// SpawnError, so a typo in the program name is one clear line, not a crash
// loop.
//
// Not thread-safe: call from the agent's single thread.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/scoped_fd.h"

namespace ddprun::agent {

class SpawnError : public std::runtime_error {
 public:
  // `program_fault`: the program itself cannot be executed (not found, not
  // executable, a bad interpreter line). Anything else (pipes, fork, log
  // files, the cgroup) is ddprun's own failure.
  SpawnError(const std::string& what, int err, bool program_fault = false)
      : std::runtime_error(what), err_(err), program_fault_(program_fault) {}
  // errno of the failed call (ENOENT: program not found).
  int error_number() const { return err_; }
  bool program_fault() const { return program_fault_; }
  // ddprun's exit status for this failure: like a shell, 127 for a program
  // not found and 126 for one that cannot be executed; 1 for ddprun's own.
  int exit_status() const { return !program_fault_ ? 1 : err_ == ENOENT ? 127 : 126; }

 private:
  int err_;
  bool program_fault_;
};

struct SpawnRequest {
  // Path passed to execve (already resolved; see resolve_program).
  std::string path;
  std::vector<std::string> argv;
  // "KEY=VALUE" strings; the child's whole environment.
  std::vector<std::string> env;
  // The child's fd 0, 1 and 2 (a pipe end, a pty, /dev/null); -1 keeps
  // the agent's.
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  // A job cgroup's cgroup.procs (JobCgroup::procs_fd) and the folder to
  // create the child in (JobCgroup::spawn_dir_fd): the child is created
  // there where the kernel can (fork_into_cgroup.h), else moves itself in
  // through cgroup.procs; -1: no cgroup.
  int cgroup_procs_fd = -1;
  int cgroup_dir_fd = -1;
  // RLIMIT_NOFILE for the program; unset keeps the agent's. The agent
  // raises its own soft limit and gives workers back the one they would have
  // had without ddprun (agent.cc says why).
  std::optional<rlimit> nofile_limit;
  // Descriptors the program inherits under their own numbers (the recovery
  // channel's end). The agent holds them close-on-exec, so no other child
  // gets them; only this child clears the flag, after fork.
  std::vector<int> inherit_fds;
  // CPUs the child is bound to (sched_setaffinity) before exec; empty: the
  // agent's own affinity (--numa-binding).
  std::vector<int> cpus;
};

// Starts the process; returns its pid, which is also its process group id.
// Throws SpawnError naming the program when fork or exec fails.
pid_t spawn_process(const SpawnRequest& request);

// spawn_process in two steps, so that several workers are started before
// the agent waits for the first one's exec and their start-ups overlap
// (serially, each worker would wait for the previous one's exec).
// start_process starts the child and returns once it has exec'd where the
// child shares the agent's memory until then (fork_into_cgroup.h), at once
// after a fork (throws SpawnError when no process could be made);
// finish_process waits for the exec, or for the child's report of why it
// could not, and then reaps the child and throws SpawnError.
struct StartedProcess {
  pid_t pid = -1;
  base::ScopedFd report;  // the close-on-exec pipe's read end
  std::string path;
};
StartedProcess start_process(const SpawnRequest& request);
void finish_process(StartedProcess& started);

// Looks `program` up like execvp does: as given when it contains '/', else
// in the colon-separated `path_env`. Throws SpawnError (ENOENT/EACCES)
// naming the program when nothing executable is found.
std::string resolve_program(const std::string& program, const std::string& path_env);

}  // namespace ddprun::agent
