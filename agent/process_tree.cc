#include "agent/process_tree.h"

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "base/pidfd.h"
#include "base/procfs.h"

namespace ddprun::agent {
namespace {

void reap_if_child(pid_t pid) {
  int status;
  while (waitpid(pid, &status, WNOHANG) < 0 && errno == EINTR) {
  }
}

}  // namespace

bool wait_gone(pid_t pid, Clock::time_point deadline) {
  bool gone = base::wait_exited(pid, deadline);
  if (gone) reap_if_child(pid);
  return gone;
}

int sweep_descendants(const std::set<pid_t>& keep, Clock::time_point deadline) {
  int killed = 0;
  const pid_t self = getpid();
  for (;;) {
    std::vector<pid_t> victims;
    for (pid_t p : base::process_tree(self))
      if (p != self && !keep.count(p)) victims.push_back(p);
    // A descendant of a kept process (the guardian has none) is still ours.
    if (victims.empty() || Clock::now() >= deadline) return killed;
    for (pid_t p : victims)
      if (kill(p, SIGKILL) == 0) ++killed;
    for (pid_t p : victims) wait_gone(p, deadline);
  }
}

}  // namespace ddprun::agent
