#include "agent/process_tree.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <map>

#include "base/pidfd.h"
#include "base/proc_stat.h"

namespace ddprun::agent {
namespace {

void reap_if_child(pid_t pid) {
  int status;
  while (waitpid(pid, &status, WNOHANG) < 0 && errno == EINTR) {
  }
}

}  // namespace

std::vector<pid_t> descendants_of(pid_t root) {
  std::multimap<pid_t, pid_t> children;
  DIR* dir = opendir("/proc");
  if (!dir) return {};
  while (dirent* e = readdir(dir)) {
    char* end;
    long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    auto st = base::read_proc_stat(static_cast<pid_t>(pid));
    if (st && st->ppid > 0) children.emplace(st->ppid, static_cast<pid_t>(pid));
  }
  closedir(dir);
  std::vector<pid_t> out;
  std::vector<pid_t> todo{root};
  while (!todo.empty()) {
    pid_t p = todo.back();
    todo.pop_back();
    auto [lo, hi] = children.equal_range(p);
    for (auto it = lo; it != hi; ++it) {
      out.push_back(it->second);
      todo.push_back(it->second);
    }
  }
  return out;
}

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
    for (pid_t p : descendants_of(self))
      if (!keep.count(p)) victims.push_back(p);
    // A descendant of a kept process (the guardian has none) is still ours.
    if (victims.empty() || Clock::now() >= deadline) return killed;
    for (pid_t p : victims)
      if (kill(p, SIGKILL) == 0) ++killed;
    for (pid_t p : victims) wait_gone(p, deadline);
  }
}

}  // namespace ddprun::agent
