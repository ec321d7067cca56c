#include "agent/process_launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <string_view>

#include "agent/guardian.h"
#include "agent/job_cgroup.h"
#include "agent/process_tree.h"
#include "base/procfs.h"
#include "base/system_error.h"

namespace ddprun::agent {
namespace {

// How long the leftovers may take to die after SIGKILL.
constexpr auto kSweepDeadline = std::chrono::seconds(5);

}  // namespace

pid_t PosixLauncher::spawn(SpawnRequest request) {
  pid_t pid = start(std::move(request));
  finish(pid);
  return pid;
}

pid_t PosixLauncher::start(SpawnRequest request) {
  request.cgroup_procs_fd = cgroup_ ? cgroup_->procs_fd() : -1;
  request.cgroup_dir_fd = cgroup_ ? cgroup_->spawn_dir_fd() : -1;
  StartedProcess started = start_process(request);
  const pid_t pid = started.pid;
  // The guardian kills the group if the agent dies from here on, exec or not.
  guardian_.add_group(pid);
  started_.emplace(pid, std::move(started));
  return pid;
}

void PosixLauncher::finish(pid_t pid) {
  auto it = started_.find(pid);
  if (it == started_.end()) return;
  StartedProcess started = std::move(it->second);
  started_.erase(it);
  try {
    finish_process(started);
  } catch (const SpawnError&) {
    guardian_.remove_group(pid);  // reaped: the pid may be anyone's soon
    throw;
  }
}

// Errors are expected and harmless here: a group whose processes are all
// gone answers ESRCH.
void PosixLauncher::signal(pid_t pid, int sig) { (void)kill(pid, sig); }

void PosixLauncher::signal_group(pid_t pgid, int sig) { (void)kill(-pgid, sig); }

void PosixLauncher::kill_job() {
  if (cgroup_ && !cgroup_->kill_all())
    spdlog::warn("cannot kill the job cgroup {}: {}", cgroup_->path(), base::errno_text(errno));
}

void PosixLauncher::sweep_leftovers() {
  if (cgroup_ && !cgroup_->kill_and_wait(Clock::now() + kSweepDeadline))
    spdlog::warn("processes in {} outlived SIGKILL for {} s", cgroup_->path(),
                 kSweepDeadline.count());
  sweep_descendants({guardian_.pid()}, Clock::now() + kSweepDeadline);
}

void PosixLauncher::release(pid_t pgid) {
  guardian_.remove_group(pgid);
  cpu_ns_.erase(pgid);  // a worker's pid is its group's id
}

bool PosixLauncher::idle(pid_t pid) { return process_idle(pid, 0); }

bool PosixLauncher::process_idle(pid_t pid, int depth) {
  auto st = base::read_proc_stat(pid);
  if (!st || st->state == 'Z' || st->state == 'X') return true;
  // schedstat's first field: nanoseconds on a CPU (stat's ticks are 10 ms,
  // coarser than a traceback being printed).
  const auto schedstat = base::read_proc_file(pid, "schedstat");
  if (!schedstat || schedstat->empty())
    return st->state != 'R' && st->state != 'D';  // no schedstat: the state alone
  const unsigned long long ns = std::strtoull(schedstat->c_str(), nullptr, 10);
  auto [it, first] = cpu_ns_.try_emplace(pid, ns);
  const bool unchanged = !first && it->second == ns;
  it->second = ns;
  if (!unchanged || (st->state != 'S' && st->state != 'T' && st->state != 't')) return false;
  // A wrapper (a shell script that runs python without exec, pyenv's shim
  // on its way to python) sleeps in wait(), or reads a command
  // substitution's pipe, while the program it started works: it is as busy
  // as its children. Asked only of a process asleep in one of those two
  // (wchan do_wait, pipe_read or 6.x's anon_pipe_read: one small read), so
  // a rank waiting in a collective costs no listing of its tasks. Bounded
  // depth: wrappers nest a few deep, not more.
  constexpr int kMaxWrapperDepth = 8;
  if (depth >= kMaxWrapperDepth) return true;
  const auto wchan = base::read_proc_file(pid, "wchan");
  if (!wchan) return true;
  const std::string_view w = *wchan;
  const bool waits_on_child =
      w == "do_wait" || (w.size() >= 9 && w.substr(w.size() - 9) == "pipe_read");
  if (!waits_on_child) return true;
  bool all = true;
  // Every child is sampled, even after a busy one: each needs its sample
  // for the next turn.
  for (pid_t child : base::child_pids(pid))
    if (!process_idle(child, depth + 1)) all = false;
  return all;
}

}  // namespace ddprun::agent
