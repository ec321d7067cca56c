#include "watchdog/proc.h"

#include <dirent.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "base/proc_stat.h"
#include "watchdog/error.h"

namespace ddprun::watchdog {

WatchdogError sys_error(const std::string& call, const std::string& path, int err) {
  return WatchdogError(call + "(" + path + "): " + std::strerror(err));
}

namespace {

std::optional<std::string> read_small_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

bool is_same_or_descendant(pid_t pid, pid_t ancestor) {
  // Bounded walk: pid 1 ends it, and so does a cycle-proof step limit.
  for (int i = 0; i < 64 && pid > 1; ++i) {
    if (pid == ancestor) return true;
    auto st = base::read_proc_stat(pid);
    if (!st) return false;
    pid = st->ppid;
  }
  return pid == ancestor;
}

bool is_python_process(pid_t pid) {
  char buf[4096];
  const std::string link = "/proc/" + std::to_string(pid) + "/exe";
  const ssize_t n = ::readlink(link.c_str(), buf, sizeof(buf) - 1);
  std::string name;
  if (n > 0) {
    name.assign(buf, static_cast<size_t>(n));
    const auto slash = name.rfind('/');
    if (slash != std::string::npos) name = name.substr(slash + 1);
  } else if (auto st = base::read_proc_stat(pid)) {
    name = st->comm;
  }
  return name.rfind("python", 0) == 0;
}

std::string proc_stack_summary(pid_t pid) {
  const std::string base = "/proc/" + std::to_string(pid);
  std::ostringstream out;
  out << "kernel view of pid " << pid << " (gdb unavailable or failed)\n";
  DIR* dir = ::opendir((base + "/task").c_str());
  if (dir == nullptr) {
    out << "  process is gone: " << std::strerror(errno) << "\n";
    return out.str();
  }
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const std::string task = base + "/task/" + e->d_name;
    auto st = base::read_proc_stat(static_cast<pid_t>(std::atoi(e->d_name)));
    out << "thread " << e->d_name;
    if (st) out << " (" << st->comm << ") state " << st->state;
    if (auto wchan = read_small_file(task + "/wchan")) out << " wchan " << trim(*wchan);
    out << "\n";
    if (auto stack = read_small_file(task + "/stack"); stack && !stack->empty()) {
      out << *stack;
    }
  }
  ::closedir(dir);
  return out.str();
}

}  // namespace ddprun::watchdog
