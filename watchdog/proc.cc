#include "watchdog/proc.h"

#include <cstdlib>
#include <sstream>

#include "base/procfs.h"
#include "base/system_error.h"
#include "watchdog/error.h"

namespace ddprun::watchdog {

WatchdogError sys_error(const std::string& call, const std::string& path, int err) {
  return WatchdogError(call + "(" + path + "): " + base::errno_text(err));
}

namespace {

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

bool is_same_or_descendant(pid_t pid, pid_t ancestor) {
  if (pid == ancestor) return true;
  for (pid_t p : base::ancestry(pid))
    if (p == ancestor) return true;
  return false;
}

bool is_python_process(pid_t pid) {
  std::string name;
  if (auto exe = base::read_proc_exe(pid)) {
    name = std::move(*exe);
    const auto slash = name.rfind('/');
    if (slash != std::string::npos) name = name.substr(slash + 1);
  } else if (auto st = base::read_proc_stat(pid)) {
    name = st->comm;
  }
  return name.rfind("python", 0) == 0;
}

std::string proc_stack_summary(pid_t pid) {
  std::ostringstream out;
  out << "kernel view of pid " << pid << " (gdb unavailable or failed)\n";
  int err = 0;
  const auto tasks = base::try_list_dir("/proc/" + std::to_string(pid) + "/task", &err);
  if (!tasks) {
    out << "  process is gone: " << base::errno_text(err) << "\n";
    return out.str();
  }
  for (const auto& e : *tasks) {
    const std::string task = "task/" + e.name;
    auto st = base::read_proc_stat(static_cast<pid_t>(std::atoi(e.name.c_str())));
    out << "thread " << e.name;
    if (st) out << " (" << st->comm << ") state " << st->state;
    if (auto wchan = base::read_proc_file(pid, task + "/wchan")) out << " wchan " << trim(*wchan);
    out << "\n";
    if (auto stack = base::read_proc_file(pid, task + "/stack"); stack && !stack->empty()) {
      out << *stack;
    }
  }
  return out.str();
}

}  // namespace ddprun::watchdog
