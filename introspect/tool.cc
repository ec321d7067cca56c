#include "introspect/tool.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

extern char** environ;

namespace ddprun::introspect {

namespace {

using Clock = std::chrono::steady_clock;

int shell_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

ToolResult run_tool(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                    std::size_t max_bytes, const std::vector<std::string>& extra_env) {
  ToolResult r;
  if (argv.empty()) {
    r.error = "empty command";
    return r;
  }
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    r.error = std::string("pipe2: ") + std::strerror(errno);
    return r;
  }
  // Exec errors travel back through a close-on-exec pipe.
  if (::pipe2(err, O_CLOEXEC) != 0) {
    r.error = std::string("pipe2: ") + std::strerror(errno);
    ::close(out[0]), ::close(out[1]);
    return r;
  }
  // Everything the child needs is built before fork (only async-signal-safe
  // calls after it).
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) env_s.emplace_back(*e);
  for (const auto& e : extra_env) env_s.push_back(e);
  std::vector<char*> env;
  for (auto& e : env_s) env.push_back(e.data());
  env.push_back(nullptr);

  const pid_t pid = ::fork();
  if (pid < 0) {
    r.error = std::string("fork: ") + std::strerror(errno);
    ::close(out[0]), ::close(out[1]), ::close(err[0]), ::close(err[1]);
    return r;
  }
  if (pid == 0) {
    ::setpgid(0, 0);  // own group: the deadline kills the tool's children too
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    ::execvpe(args[0], args.data(), env.data());
    const int e = errno;
    (void)!::write(err[1], &e, sizeof e);
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  ::close(out[1]);
  ::close(err[1]);
  int exec_errno = 0;
  const bool exec_failed = ::read(err[0], &exec_errno, sizeof exec_errno) == sizeof exec_errno;
  ::close(err[0]);
  if (exec_failed) {
    r.error = argv[0] + ": " + std::strerror(exec_errno);
  } else {
    r.started = true;
  }
  const auto deadline = Clock::now() + timeout;
  char buf[4096];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      r.timed_out = true;
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(left));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;  // timeout: the loop head ends it
    const ssize_t got = ::read(out[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;  // EOF: the tool closed its output
    if (r.output.size() < max_bytes) {
      r.output.append(buf, std::min<std::size_t>(static_cast<std::size_t>(got),
                                                 max_bytes - r.output.size()));
    }
  }
  ::close(out[0]);
  if (r.timed_out) ::kill(-pid, SIGKILL);
  // After EOF the tool exits at once; a tool that closed its output early
  // gets the rest of the deadline, then SIGKILL.
  int status = 0;
  for (;;) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) break;
    if (Clock::now() >= deadline && !r.timed_out) {
      r.timed_out = true;
      ::kill(-pid, SIGKILL);
    }
    ::usleep(2000);  // bounded by the deadline (then SIGKILL ends it at once)
  }
  r.exit_code = shell_code(status);
  return r;
}

}  // namespace ddprun::introspect
