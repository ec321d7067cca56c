#include "agent/process_tree.h"

#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

namespace ddprun::agent {
namespace {

// Parent pid from /proc/<pid>/stat; -1 when the process is gone. The comm
// field may hold spaces and parentheses, so parse after the last ')'.
pid_t parent_of(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "re");
  if (!f) return -1;
  char buf[512];
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  std::string s(buf);
  auto close = s.rfind(')');
  if (close == std::string::npos || close + 4 >= s.size()) return -1;
  // ") S 1234 ..." : state, then ppid.
  return static_cast<pid_t>(std::atoi(s.c_str() + close + 4));
}

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
    pid_t ppid = parent_of(static_cast<pid_t>(pid));
    if (ppid > 0) children.emplace(ppid, static_cast<pid_t>(pid));
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
  int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) {
    reap_if_child(pid);
    return errno == ESRCH;
  }
  bool gone = false;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd p{fd, POLLIN, 0};
    int r = poll(&p, 1, left.count() > 0 ? static_cast<int>(left.count()) : 0);
    if (r < 0 && errno == EINTR) continue;
    gone = r > 0;
    break;
  }
  close(fd);
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
