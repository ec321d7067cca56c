// Starting one worker: fork + execve of an argv vector, never a shell.
//
// The child gets its own process group (so the terminal's ctrl-c reaches
// the agent first and the agent can signal the worker and everything it
// started as one group), a parent-death SIGKILL (so a SIGKILLed agent leaves
// no worker behind), default signal dispositions and an empty signal mask,
// and its stdout/stderr on the given pipes. An exec failure comes back
// through a close-on-exec pipe and is thrown as SpawnError, so a typo in the
// program name is one clear line, not a crash loop.
//
// Not thread-safe: call from the agent's single thread.
#pragma once

#include <sys/types.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace ddprun::agent {

class SpawnError : public std::runtime_error {
 public:
  SpawnError(const std::string& what, int err) : std::runtime_error(what), err_(err) {}
  // errno of the failed call (ENOENT: program not found).
  int error_number() const { return err_; }

 private:
  int err_;
};

struct SpawnRequest {
  // Path passed to execve (already resolved; see resolve_program).
  std::string path;
  std::vector<std::string> argv;
  // "KEY=VALUE" strings; the child's whole environment.
  std::vector<std::string> env;
  // Write ends the child gets as fd 1 and 2; -1 keeps the agent's.
  int stdout_fd = -1;
  int stderr_fd = -1;
};

// Starts the process; returns its pid, which is also its process group id.
// Throws SpawnError naming the program when fork or exec fails.
pid_t spawn_process(const SpawnRequest& request);

// Looks `program` up like execvp does: as given when it contains '/', else
// in the colon-separated `path_env`. Throws SpawnError (ENOENT/EACCES)
// naming the program when nothing executable is found.
std::string resolve_program(const std::string& program, const std::string& path_env);

}  // namespace ddprun::agent
