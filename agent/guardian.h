// The guardian: a tiny forked process that kills the workers' process groups
// when the agent dies without cleaning up (SIGKILL, OOM killer).
//
// Workers die with the agent through their parent-death signal, but their
// own children (data loaders) do not, and the agent is no longer there to
// reap them. The guardian holds the read end of a pipe whose only write end
// is the agent's; it learns each worker group's id through that pipe, and
// when the pipe reaches EOF (the agent is gone, whatever killed it) it
// SIGKILLs every group still registered. It ignores the signals a terminal
// or a job scheduler sends, so it outlives the agent by design.
//
// Move-only; the destructor closes the pipe (the guardian then exits after
// killing nothing, as every group has been removed) and reaps it.
#pragma once

#include <sys/types.h>

namespace ddprun::agent {

class Guardian {
 public:
  // Forks the guardian. Call before any worker exists.
  Guardian();
  ~Guardian();
  Guardian(Guardian&& other) noexcept;
  Guardian& operator=(Guardian&&) = delete;
  Guardian(const Guardian&) = delete;
  Guardian& operator=(const Guardian&) = delete;

  void add_group(pid_t pgid);
  void remove_group(pid_t pgid);
  pid_t pid() const { return pid_; }

 private:
  void send(char op, pid_t pgid);

  pid_t pid_ = -1;
  int fd_ = -1;
};

}  // namespace ddprun::agent
