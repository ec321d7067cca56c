// The guardian: a tiny forked process that ends the job's processes when the
// agent dies without cleaning up (kill -9 of its pid or of its process
// group, the OOM killer).
//
// Workers die with the agent through their parent-death signal, but their
// own children (data loaders, daemons) do not, and the agent is no longer
// there to reap them. The guardian holds the read end of a pipe whose only
// write end is the agent's; it learns each worker group's id through that
// pipe, and when the pipe reaches EOF (the agent is gone, whatever killed
// it) it SIGKILLs every group still registered and then:
//  - with a job cgroup (job_cgroup.h): writes its cgroup.kill, which takes
//    every process in it, also those that left their group or session,
//    waits (bounded) until it is empty and removes it;
//  - without one: SIGKILLs every process whose environment carries the
//    job's containment token (workers get it; their children inherit it),
//    which finds setsid()-ed grandchildren and daemons too, unless they
//    cleared their environment.
//
// The guardian runs in a session of its own (kill -9 -<pgid> of ddprun, what
// bash's `kill -9 %1` does, does not reach it), ignores the signals a
// terminal or a scheduler sends, keeps no descriptor but its pipe (stdio on
// /dev/null, so it never holds the console, a log or a socket open), and
// sits in "/" so it keeps no mount busy.
//
// Forked before the first worker, although its fork is on the launch's
// path (0.2-0.3 ms: the agent's page tables are copied, and the agent's
// next writes to its pages fault, copy-on-write): a worker runs its own code from its
// exec on, and may fork at once (a C program, a shell script), so a kill -9
// of the agent between the workers' start and the guardian's would leave
// those grandchildren running. The workers' parent-death signal ends only
// the workers, the subreaper bit dies with the agent, and a dead agent's
// populated job cgroup is left for its guardian, which would not exist.
//
// Move-only; the destructor closes the pipe (the guardian then kills what is
// left, normally nothing) and reaps it.
#pragma once

#include <sys/types.h>

#include <string>

#include "base/scoped_fd.h"

namespace ddprun::agent {

class Guardian {
 public:
  // Forks the guardian. Call before any worker exists. `cgroup_dir`: the
  // job cgroup's folder, or empty. `env_token`: "NAME=value" every worker's
  // environment carries, searched for when there is no cgroup; or empty.
  explicit Guardian(const std::string& cgroup_dir = "", const std::string& env_token = "");
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
  base::ScopedFd fd_;
};

}  // namespace ddprun::agent
