#include "agent/spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <linux/close_range.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <system_error>

#include "agent/fork_into_cgroup.h"
#include "base/scoped_fd.h"
#include "base/subprocess.h"
#include "base/system_error.h"

namespace ddprun::agent {
namespace {

// What the child reports through the close-on-exec pipe when it cannot
// exec: which step failed and its errno. Only kExec is the program's fault.
struct ChildReport {
  enum Step : int { kSetup = 0, kCgroup = 1, kExec = 2 } step;
  int err;
};

// What the child reads: built before it starts, never written after (it
// may share the agent's memory: fork_into_cgroup.h).
struct ChildPlan {
  const char* path;
  char* const* argv;
  char* const* envp;
  const SpawnRequest* req;
  int report_fd;
  pid_t agent;
  const cpu_set_t* cpus;  // null: the agent's affinity
};

// Runs in the child: async-signal-safe calls only, nothing of the agent's
// memory written (the report lives on the child's own stack).
[[noreturn]] void child_exec(const void* plan_ptr, bool in_cgroup) {
  const ChildPlan& plan = *static_cast<const ChildPlan*>(plan_ptr);
  const SpawnRequest& req = *plan.req;
  const pid_t agent = plan.agent;
  const cpu_set_t* cpus = plan.cpus;
  ChildReport report{ChildReport::kSetup, 0};
  // --numa-binding: bound before the program (and its threads) exist.
  if (cpus != nullptr && sched_setaffinity(0, sizeof(cpu_set_t), cpus) != 0) goto fail;
  // Own process group, so the agent can signal the worker and its children
  // as one, and a terminal's ctrl-c goes to the agent only.
  if (setpgid(0, 0) != 0) goto fail;
  // Into the job's cgroup before any of the program's code runs (unless it
  // was created there): whatever it starts (setsid daemons too) stays where
  // cgroup.kill reaches it.
  if (!in_cgroup && req.cgroup_procs_fd >= 0 && write(req.cgroup_procs_fd, "0", 1) != 1) {
    report.step = ChildReport::kCgroup;
    goto fail;
  }
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) goto fail;
  // The agent may have died between fork and prctl: then nobody would ever
  // send the death signal.
  if (getppid() != agent) _exit(125);
  // Under Yama's ptrace_scope=1 only a tracee's ancestors may attach; the
  // watchdog's stack capture (eu-stack, gdb) runs as the agent's child, a
  // sibling. Naming the agent lets its descendants attach. EINVAL without
  // Yama is expected and harmless.
  (void)prctl(PR_SET_PTRACER, agent, 0, 0, 0);
  if (req.stdin_fd >= 0 && dup2(req.stdin_fd, STDIN_FILENO) < 0) goto fail;
  if (req.stdout_fd >= 0 && dup2(req.stdout_fd, STDOUT_FILENO) < 0) goto fail;
  if (req.stderr_fd >= 0 && dup2(req.stderr_fd, STDERR_FILENO) < 0) goto fail;
  // Nothing of the agent's beyond stdio and inherit_fds reaches the
  // program, as torchrun's Popen(close_fds=True): Boost.Asio opens its
  // sockets without SOCK_CLOEXEC, and a worker holding the store's
  // listening socket kept the port bound (EADDRINUSE for the next agent)
  // and clients queued after the agent died; it also held the heartbeat
  // and control sockets. Without close_range (before Linux 5.11) the fds
  // stay as they were.
  (void)syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC);
  for (int fd : req.inherit_fds)
    if (fcntl(fd, F_SETFD, 0) != 0) goto fail;
  if (req.nofile_limit && setrlimit(RLIMIT_NOFILE, &*req.nofile_limit) != 0) goto fail;
  base::reset_signals_for_exec();  // undo the agent's handlers, ignores and mask
  execve(plan.path, plan.argv, plan.envp);
  report.step = ChildReport::kExec;
fail:
  report.err = errno;
  ssize_t ignored = write(plan.report_fd, &report, sizeof report);
  (void)ignored;
  _exit(127);
}

}  // namespace

StartedProcess start_process(const SpawnRequest& request) {
  // Everything the child needs is built before fork: after fork only
  // async-signal-safe calls are allowed.
  std::vector<char*> argv = base::exec_array(request.argv);
  std::vector<char*> envp = base::exec_array(request.env);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int c : request.cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &cpus);
  base::Pipe report;
  try {
    report = base::make_pipe(O_CLOEXEC);
  } catch (const std::system_error& e) {
    throw SpawnError(e.what(), e.code().value());
  }

  // Block every signal across fork so the child cannot run the agent's
  // handlers (which would write into the agent's signal pipe) before it has
  // reset them.
  sigset_t all, old;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, &old);
  const ChildPlan plan{request.path.c_str(), argv.data(), envp.data(), &request,
                       report.write.get(), getpid(), request.cpus.empty() ? nullptr : &cpus};
  bool in_cgroup = false;
  pid_t pid = start_in_cgroup(request.cgroup_procs_fd >= 0 ? request.cgroup_dir_fd : -1,
                              child_exec, &plan, &in_cgroup);
  int fork_errno = errno;
  sigprocmask(SIG_SETMASK, &old, nullptr);
  report.write.reset();
  if (pid < 0) throw SpawnError(base::describe_error("fork", "", fork_errno), fork_errno);
  // Also set the group from the parent, so it exists before we ever signal
  // it (whoever runs first wins; the other call is a harmless EACCES/ok).
  setpgid(pid, pid);
  StartedProcess started;
  started.pid = pid;
  started.report = std::move(report.read);
  started.path = request.path;
  return started;
}

void finish_process(StartedProcess& started) {
  ChildReport child{};
  ssize_t n;
  do {
    // Bounded by the child: it execs or reports within its few set-up calls.
    n = read(started.report.get(), &child, sizeof child);
  } while (n < 0 && errno == EINTR);
  started.report.reset();
  if (n == static_cast<ssize_t>(sizeof child)) {
    // The child exec'd nothing; reap it here so nobody sees a worker exit.
    int status;
    while (waitpid(started.pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (child.step == ChildReport::kExec)
      throw SpawnError("cannot execute '" + started.path + "': " + base::errno_text(child.err),
                       child.err, true);
    throw SpawnError(std::string(child.step == ChildReport::kCgroup
                                     ? "cannot move the worker into its cgroup: "
                                     : "cannot set up the worker process: ") +
                         base::errno_text(child.err),
                     child.err);
  }
}

pid_t spawn_process(const SpawnRequest& request) {
  StartedProcess started = start_process(request);
  finish_process(started);
  return started.pid;
}

std::string resolve_program(const std::string& program, const std::string& path_env) {
  if (program.empty()) throw SpawnError("no program to run", EINVAL, true);
  const std::string found = base::find_program(program, path_env);
  if (!found.empty()) return found;
  if (program.find('/') == std::string::npos)
    throw SpawnError("cannot execute '" + program + "': not found in PATH", ENOENT, true);
  int err = access(program.c_str(), F_OK) == 0 ? EACCES : ENOENT;
  throw SpawnError("cannot execute '" + program + "': " + base::errno_text(err), err, true);
}

}  // namespace ddprun::agent
