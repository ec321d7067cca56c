#include "agent/guardian.h"

#include <dirent.h>  // DT_DIR
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <system_error>

#include "agent/process_tree.h"
#include "base/procfs.h"
#include "base/system_error.h"

namespace ddprun::agent {
namespace {

// Everything below runs in the forked guardian, which may have been forked
// from a multi-threaded agent: raw system calls and static buffers only (no
// allocation, no stdio, no locks).

constexpr int kMaxGroups = 4096;
constexpr int kPipeFd = 3;
// How long the guardian waits for a killed cgroup to empty before rmdir.
constexpr long kCgroupWaitMs = 10000;

struct GuardianPaths {
  const char* cgroup_dir = nullptr;     // empty string: no cgroup
  const char* cgroup_kill = nullptr;
  const char* cgroup_events = nullptr;
  const char* env_token = nullptr;      // empty string: no token scan
  size_t env_token_len = 0;
};

long now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

// Keeps the pipe (moved to fd 3) and nothing else the agent had open; stdio
// goes to /dev/null.
void keep_only_pipe(int pipe_fd) {
  if (pipe_fd != kPipeFd) dup2(pipe_fd, kPipeFd);
  base::close_from(kPipeFd + 1);
  base::ScopedFd null(open("/dev/null", O_RDWR));
  for (int fd = 0; fd <= 2; ++fd)
    if (null && null.get() != fd) dup2(null.get(), fd);
  if (null.get() <= 2) null.release();  // it is one of stdio now
}

bool write_one(const char* path) {
  base::ScopedFd fd(open(path, O_WRONLY | O_CLOEXEC));
  return fd && write(fd.get(), "1", 1) == 1;
}

// cgroup.kill, then wait (bounded) for "populated 0" and remove the folder.
void kill_cgroup(const GuardianPaths& p) {
  if (!write_one(p.cgroup_kill)) return;
  base::ScopedFd events(open(p.cgroup_events, O_RDONLY | O_CLOEXEC));
  long deadline = now_ms() + kCgroupWaitMs;
  while (events) {
    char buf[256];
    ssize_t n = pread(events.get(), buf, sizeof buf - 1, 0);
    if (n <= 0) break;
    buf[n] = '\0';
    if (!strstr(buf, "populated 1")) break;
    long left = deadline - now_ms();
    if (left <= 0) break;
    pollfd pfd{events.get(), POLLPRI, 0};
    poll(&pfd, 1, static_cast<int>(left));
  }
  events.reset();
  // The attempt.<n> child cgroups first (job_cgroup.h): a folder with
  // children cannot be removed.
  if (base::ScopedFd dir(open(p.cgroup_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)); dir) {
    auto each = [&](const char* name, unsigned char type) {
      if (type == DT_DIR && name[0] != '.') unlinkat(dir.get(), name, AT_REMOVEDIR);
    };
    base::for_each_entry_no_alloc(dir.get(), each);
  }
  rmdir(p.cgroup_dir);
}

// SIGKILLs every process carrying the token; repeats while it finds any
// (a process may fork while the scan runs), a bounded number of times.
void kill_by_token(const GuardianPaths& p) {
  const pid_t self = getpid();
  for (int pass = 0; pass < 8; ++pass) {
    base::ScopedFd dir(open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dir) return;
    int killed = 0;
    auto each = [&](const char* name, unsigned char) {
      if (name[0] < '1' || name[0] > '9') return;
      pid_t pid = static_cast<pid_t>(atoi(name));
      if (pid == self || !base::proc_environ_has_no_alloc(name, p.env_token, p.env_token_len)) return;
      if (kill(pid, SIGKILL) == 0) ++killed;
    };
    base::for_each_entry_no_alloc(dir.get(), each);
    dir.reset();
    if (killed == 0) return;
  }
}

[[noreturn]] void guardian_main(const GuardianPaths& paths) {
  static pid_t groups[kMaxGroups];
  int count = 0;
  char buf[512];
  char line[32];
  int len = 0;
  for (;;) {
    ssize_t n = read(kPipeFd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] != '\n') {
        if (len < static_cast<int>(sizeof line) - 1) line[len++] = buf[i];
        continue;
      }
      line[len] = '\0';
      len = 0;
      pid_t pgid = static_cast<pid_t>(atoi(line + 1));
      if (pgid <= 0) continue;
      if (line[0] == '+' && count < kMaxGroups) {
        groups[count++] = pgid;
      } else if (line[0] == '-') {
        for (int j = 0; j < count; ++j)
          if (groups[j] == pgid) groups[j] = groups[--count];
      }
    }
  }
  for (int j = 0; j < count; ++j) kill(-groups[j], SIGKILL);
  if (paths.cgroup_dir[0] != '\0') kill_cgroup(paths);
  if (paths.env_token_len > 0) kill_by_token(paths);
  _exit(0);
}

}  // namespace

Guardian::Guardian(const std::string& cgroup_dir, const std::string& env_token) {
  // Built before fork: the child may not allocate.
  const std::string kill_path = cgroup_dir.empty() ? "" : cgroup_dir + "/cgroup.kill";
  const std::string events_path = cgroup_dir.empty() ? "" : cgroup_dir + "/cgroup.events";
  GuardianPaths paths{cgroup_dir.c_str(), kill_path.c_str(), events_path.c_str(),
                      env_token.c_str(), env_token.size()};
  base::Pipe pipe;
  try {
    pipe = base::make_pipe(O_CLOEXEC);
  } catch (const std::system_error& e) {
    throw std::runtime_error(std::string("guardian ") + e.what());
  }
  sigset_t all, old;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, &old);
  pid_t pid = fork();
  if (pid == 0) {
    // A session of its own: signals to ddprun's process group or session
    // (kill -9 -<pgid>, a terminal hangup) do not reach the guardian.
    setsid();
    keep_only_pipe(pipe.read.get());
    if (chdir("/") != 0) {
      // Staying in the agent's folder only keeps a mount busy; go on.
    }
    // Survive what is sent to the agent (ctrl-c, a scheduler's SIGTERM, and
    // Slurm's early-warning SIGUSR1/SIGUSR2, which `scancel --signal` and
    // `--signal=USR1@90` send to every process of the step): the guardian's
    // job starts when the agent is gone.
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU, SIGUSR1,
                    SIGUSR2, SIGALRM})
      signal(sig, SIG_IGN);
    signal(SIGCHLD, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    prctl(PR_SET_NAME, "ddprun-guardian");
    guardian_main(paths);
  }
  int fork_errno = errno;
  sigprocmask(SIG_SETMASK, &old, nullptr);
  if (pid < 0) throw base::SystemError("guardian fork", "", fork_errno);
  pid_ = pid;
  fd_ = std::move(pipe.write);
}

Guardian::Guardian(Guardian&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), fd_(std::move(other.fd_)) {}

Guardian::~Guardian() {
  fd_.reset();
  if (pid_ > 0) wait_gone(pid_, Clock::now() + std::chrono::seconds(5));
}

void Guardian::send(char op, pid_t pgid) {
  if (!fd_) return;
  char line[32];
  int n = std::snprintf(line, sizeof line, "%c%d\n", op, static_cast<int>(pgid));
  // Records are far below PIPE_BUF, so each write is atomic; a dead guardian
  // (EPIPE; SIGPIPE is ignored by the agent) only loses the safety net.
  base::write_fully(fd_.get(), line, static_cast<size_t>(n));
}

void Guardian::add_group(pid_t pgid) { send('+', pgid); }
void Guardian::remove_group(pid_t pgid) { send('-', pgid); }

}  // namespace ddprun::agent
