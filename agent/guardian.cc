#include "agent/guardian.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "agent/process_tree.h"

namespace ddprun::agent {
namespace {

constexpr int kMaxGroups = 4096;

// Runs in the forked guardian: reads "+pgid\n" / "-pgid\n" records until EOF,
// then kills what is still registered. No allocation, no stdio.
[[noreturn]] void guardian_main(int fd) {
  static pid_t groups[kMaxGroups];
  int count = 0;
  char buf[512];
  char line[32];
  int len = 0;
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
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
  _exit(0);
}

}  // namespace

Guardian::Guardian() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("guardian pipe2: ") + strerror(errno));
  sigset_t all, old;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, &old);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[1]);
    // Survive what is sent to the agent's process group (ctrl-c, a
    // scheduler's SIGTERM): the guardian's job starts when the agent is gone.
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU})
      signal(sig, SIG_IGN);
    for (int sig : {SIGCHLD, SIGUSR1, SIGUSR2, SIGALRM}) signal(sig, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    prctl(PR_SET_NAME, "ddprun-guardian");
    guardian_main(fds[0]);
  }
  int fork_errno = errno;
  sigprocmask(SIG_SETMASK, &old, nullptr);
  close(fds[0]);
  if (pid < 0) {
    close(fds[1]);
    throw std::runtime_error(std::string("guardian fork: ") + strerror(fork_errno));
  }
  pid_ = pid;
  fd_ = fds[1];
}

Guardian::Guardian(Guardian&& other) noexcept : pid_(other.pid_), fd_(other.fd_) {
  other.pid_ = -1;
  other.fd_ = -1;
}

Guardian::~Guardian() {
  if (fd_ >= 0) close(fd_);
  if (pid_ > 0) wait_gone(pid_, Clock::now() + std::chrono::seconds(5));
}

void Guardian::send(char op, pid_t pgid) {
  if (fd_ < 0) return;
  char line[32];
  int n = std::snprintf(line, sizeof line, "%c%d\n", op, static_cast<int>(pgid));
  // Records are far below PIPE_BUF, so each write is atomic; a dead guardian
  // (EPIPE; SIGPIPE is ignored by the agent) only loses the safety net.
  ssize_t w;
  do {
    w = write(fd_, line, static_cast<size_t>(n));
  } while (w < 0 && errno == EINTR);
}

void Guardian::add_group(pid_t pgid) { send('+', pgid); }
void Guardian::remove_group(pid_t pgid) { send('-', pgid); }

}  // namespace ddprun::agent
