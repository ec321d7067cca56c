#include "agent/fork_into_cgroup.h"

#include <errno.h>
#include <linux/sched.h>  // struct clone_args, CLONE_INTO_CGROUP
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

#include "base/mutex.h"

#if defined(__SANITIZE_THREAD__)
#define DDPRUN_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DDPRUN_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define DDPRUN_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DDPRUN_ASAN 1
#endif
#endif
// fork_into_cgroup.h: where the child shares the agent's memory.
#if defined(__x86_64__) && !defined(DDPRUN_TSAN) && !defined(DDPRUN_ASAN)
#define DDPRUN_SHARED_MEMORY_CHILD 1
#endif

namespace ddprun::agent {
namespace {

// Cleared after the first ENOSYS/E2BIG/EINVAL: the kernel has no such
// clone3, and asking again for every worker would only cost a system call.
std::atomic<bool> clone3_works{true};

#ifdef DDPRUN_SHARED_MEMORY_CHILD
// The child's own stack while it shares the agent's memory; the guard page
// below it turns an overflow into a crash of the child, not a corruption.
constexpr size_t kChildStack = 64 * 1024;

struct Start {
  ChildMain child;
  const void* arg;
  bool placed;
};

// The children's stack with its guard page, mapped for the first child and
// kept: a child runs on it only while its caller waits (CLONE_VFORK), and
// `mu` lets one child at a time have it. Not mapped and unmapped for each
// child: with the agent's other threads about, the munmap (and the guard's
// mprotect) sent a TLB shoot-down to their CPUs, an interrupt that leaves a
// virtual machine (docs/BENCHMARKS.md, "one child stack").
struct ChildStack {
  base::Mutex mu;
  void* mapping GUARDED_BY(mu) = MAP_FAILED;  // the guard page, then kChildStack
};

ChildStack& child_stack() {
  static ChildStack s;
  return s;
}

int child_entry(void* p) {
  const Start* s = static_cast<const Start*>(p);
  s->child(s->arg, s->placed);
  return 127;  // `child` ends in execve or _exit; never here
}
#endif

}  // namespace
}  // namespace ddprun::agent

#ifdef DDPRUN_SHARED_MEMORY_CHILD
// long ddprun_clone3_run(clone_args*, size_t, int (*fn)(void*), void* arg):
// clone3, then in the child (on args->stack, its own) exit_group(fn(arg));
// the parent gets the system call's result (the pid, or -errno). Not
// syscall(SYS_clone3, ...): a child sharing the memory would return from it
// into the frames the suspended parent still owns. syscall keeps every
// register but rax, rcx and r11, so fn (rdx) and arg (moved from rcx to r8)
// reach the child.
static_assert(SYS_clone3 == 435 && SYS_exit_group == 231, "x86-64 system call numbers");
extern "C" long ddprun_clone3_run(clone_args* args, size_t size, int (*fn)(void*), void* arg);
asm(R"(
    .pushsection .text
    .p2align 4
    .globl ddprun_clone3_run
    .hidden ddprun_clone3_run
    .type ddprun_clone3_run, @function
ddprun_clone3_run:
    mov %rcx, %r8
    mov $435, %eax
    syscall
    test %rax, %rax
    jz 1f
    ret
1:  xor %ebp, %ebp
    mov %r8, %rdi
    call *%rdx
    mov %eax, %edi
    mov $231, %eax
    syscall
    hlt
    .size ddprun_clone3_run, .-ddprun_clone3_run
    .popsection
)");
#endif

namespace ddprun::agent {

pid_t start_in_cgroup(int cgroup_dir_fd, ChildMain child, const void* arg, bool* placed) {
  *placed = false;
  clone_args args{};
  args.exit_signal = SIGCHLD;
  if (cgroup_dir_fd >= 0) {
    args.flags = CLONE_INTO_CGROUP;
    args.cgroup = static_cast<__u64>(cgroup_dir_fd);
  }
  // glibc has no clone3 wrapper (nor the wheel's 2.34 floor).
#if defined(DDPRUN_SHARED_MEMORY_CHILD)
  ChildStack& stack = child_stack();
  base::MutexLock lock(stack.mu);
  if (stack.mapping == MAP_FAILED && clone3_works.load(std::memory_order_relaxed)) {
    void* m = mmap(nullptr, kChildStack + 4096, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (m != MAP_FAILED && mprotect(m, 4096, PROT_NONE) != 0) {
      munmap(m, kChildStack + 4096);
      m = MAP_FAILED;
    }
    stack.mapping = m;
  }
  if (stack.mapping != MAP_FAILED && clone3_works.load(std::memory_order_relaxed)) {
    args.flags |= CLONE_VM | CLONE_VFORK;
    args.stack = reinterpret_cast<__u64>(stack.mapping) + 4096;
    args.stack_size = kChildStack;
    // Read by the child in this frame: the caller waits until it is done.
    const Start start{child, arg, cgroup_dir_fd >= 0};
    const long r = ddprun_clone3_run(&args, sizeof args, child_entry, const_cast<Start*>(&start));
    if (r > 0) {
      *placed = start.placed;
      return static_cast<pid_t>(r);
    }
    if (r == -ENOSYS || r == -E2BIG || r == -EINVAL)
      clone3_works.store(false, std::memory_order_relaxed);
    // Any other refusal (EACCES, EBUSY, ...): fork() and the child's
    // cgroup.procs write name the error the user can act on.
  }
  lock.unlock();
#elif !defined(DDPRUN_TSAN)
  if (cgroup_dir_fd >= 0 && clone3_works.load(std::memory_order_relaxed)) {
    // No CLONE_VM and no stack: the child continues on a copy of this
    // stack, as after fork().
    const long pid = syscall(SYS_clone3, &args, sizeof args);
    if (pid == 0) {
      child(arg, true);
      _exit(127);
    }
    if (pid > 0) {
      *placed = true;
      return static_cast<pid_t>(pid);
    }
    if (errno == ENOSYS || errno == E2BIG || errno == EINVAL)
      clone3_works.store(false, std::memory_order_relaxed);
    // Any other refusal: fork(), as above.
  }
#else
  (void)args;  // TSan's runtime must see every fork: fork() only
#endif
  const pid_t pid = fork();
  if (pid == 0) {
    child(arg, false);
    _exit(127);
  }
  return pid;
}

}  // namespace ddprun::agent
