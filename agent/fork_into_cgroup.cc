#include "agent/fork_into_cgroup.h"

#include <errno.h>
#include <linux/sched.h>  // struct clone_args, CLONE_INTO_CGROUP
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

#if defined(__SANITIZE_THREAD__)
#define DDPRUN_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DDPRUN_TSAN 1
#endif
#endif

namespace ddprun::agent {
namespace {

// Cleared after the first ENOSYS/E2BIG/EINVAL: the kernel has no such
// clone3, and asking again for every worker would only cost a system call.
std::atomic<bool> clone3_works{true};

}  // namespace

pid_t fork_into_cgroup(int cgroup_dir_fd, bool* placed) {
  *placed = false;
#ifndef DDPRUN_TSAN
  if (cgroup_dir_fd >= 0 && clone3_works.load(std::memory_order_relaxed)) {
    clone_args args{};
    args.flags = CLONE_INTO_CGROUP;
    args.exit_signal = SIGCHLD;
    args.cgroup = static_cast<__u64>(cgroup_dir_fd);
    // No CLONE_VM and no stack: the child continues on a copy of this
    // stack, as after fork(). glibc has no wrapper (nor the wheel's 2.34 floor).
    long pid = syscall(SYS_clone3, &args, sizeof args);
    if (pid >= 0) {
      *placed = true;
      return static_cast<pid_t>(pid);
    }
    if (errno == ENOSYS || errno == E2BIG || errno == EINVAL)
      clone3_works.store(false, std::memory_order_relaxed);
    // Any other refusal (EACCES, EBUSY, ...): fork() and the cgroup.procs
    // write below it name the error the user can act on.
  }
#else
  (void)cgroup_dir_fd;
#endif
  return fork();
}

}  // namespace ddprun::agent
