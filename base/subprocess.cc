#include "base/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "base/pidfd.h"
#include "base/scoped_fd.h"
#include "base/system_error.h"

extern char** environ;

namespace ddprun::base {

namespace {

bool executable_file(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::string name_of(const std::string& entry) { return entry.substr(0, entry.find('=')); }

// The child's environment: ours, with extra's names replaced, then extra.
std::vector<std::string> child_env(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string entry(*e);
    bool replaced = false;
    for (const auto& x : extra) replaced = replaced || name_of(x) == name_of(entry);
    if (!replaced) env.push_back(entry);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

std::string path_of(const std::vector<std::string>& env) {
  for (const auto& e : env)
    if (e.rfind("PATH=", 0) == 0) return e.substr(5);
  return {};
}

}  // namespace

void reap_child(pid_t pid, bool quiet_exit, int* status) {
  int s = 0;
  while (::waitpid(pid, &s, quiet_exit ? __WCLONE : 0) < 0 && errno == EINTR) {
  }
  if (status) *status = s;
}

std::string find_program(const std::string& name, const std::string& path_env) {
  if (name.empty()) return {};
  if (name.find('/') != std::string::npos) return executable_file(name) ? name : "";
  std::istringstream dirs(path_env.empty() ? "/usr/local/bin:/usr/bin:/bin" : path_env);
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (executable_file(candidate)) return candidate;
  }
  return {};
}

std::vector<char*> exec_array(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

void reset_signals_for_exec() {
  struct sigaction default_action{};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    ::sigaction(sig, &default_action, nullptr);  // EINVAL for the libc-reserved ones: harmless
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
}

pid_t start_child(const ChildSpec& spec, std::string* error) {
  auto fail = [&](const std::string& why) {
    if (error) *error = why;
    return pid_t{-1};
  };
  if (spec.argv.empty()) return fail("empty command");
  std::vector<std::string> env_s = child_env(spec.extra_env);
  std::string program = spec.argv[0];
  if (program.find('/') == std::string::npos) {
    program = find_program(program, path_of(env_s));
    if (program.empty()) return fail(spec.argv[0] + ": not found in PATH");
  }  // a path: execve's errno says what is wrong with it

  // Everything the child uses is made here, before the fork.
  std::vector<char*> argv = exec_array(spec.argv);
  std::vector<char*> env = exec_array(env_s);
  ScopedFd null(::open("/dev/null", O_RDWR | O_CLOEXEC));
  if (!null) return fail(describe_error("/dev/null", "", errno));
  const int out = spec.output_fd >= 0 ? spec.output_fd : null.get();
  int exec_pipe[2];
  if (::pipe2(exec_pipe, O_CLOEXEC) != 0) return fail(describe_error("pipe2", "", errno));
  ScopedFd exec_read(exec_pipe[0]), exec_write(exec_pipe[1]);
  struct sigaction default_action{};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  // The child of a multi-threaded parent: async-signal-safe calls only.
  auto exec_tool = [&] {
    if (::dup2(null.get(), 0) < 0 || ::dup2(out, 1) < 0 || ::dup2(out, 2) < 0) ::_exit(127);
    reset_signals_for_exec();
    ::execve(program.c_str(), argv.data(), env.data());
    const int e = errno;
    (void)!::write(exec_write.get(), &e, sizeof e);
    ::_exit(127);
  };
  // quiet_exit: clone with no flags and no stack is a fork whose end sends
  // no signal, but only until it execs (exec makes it an ordinary child
  // again: SIGCHLD, seen by waitpid(-1)). So that clone child never execs:
  // it forks the tool, waits for it and exits with its code (128+N for a
  // signal); the tool's own SIGCHLD goes to it. Same group: the deadline's
  // kill reaches both.
  const long pid = spec.quiet_exit ? ::syscall(SYS_clone, 0L, nullptr, nullptr, nullptr, 0L)
                                   : static_cast<long>(::fork());
  if (pid < 0) return fail(describe_error("fork", "", errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    if (!spec.quiet_exit) exec_tool();
    ::sigaction(SIGCHLD, &default_action, nullptr);  // an ignored SIGCHLD would reap it for us
    // Raw system calls: the sanitizers' fork and wait interceptors take
    // locks another thread of the parent may have held at the clone.
    const long tool = ::syscall(SYS_clone, static_cast<long>(SIGCHLD), nullptr, nullptr, nullptr, 0L);
    if (tool < 0) ::_exit(127);
    if (tool == 0) exec_tool();
    ::close(exec_write.get());  // the parent's read ends at the tool's exec, not at our exit
    int s = 0;
    while (::syscall(SYS_wait4, tool, &s, 0, nullptr) < 0 && errno == EINTR) {
    }
    ::_exit(shell_exit_code(s));  // a termination status: never -1
  }
  const auto child = static_cast<pid_t>(pid);
  ::setpgid(child, child);  // as the child does: a kill right after this finds the group
  exec_write.reset();
  int exec_errno = 0;
  ssize_t got;
  while ((got = ::read(exec_read.get(), &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR) {
  }
  if (got == sizeof exec_errno) {
    reap_child(child, spec.quiet_exit, nullptr);
    return fail(describe_error(spec.argv[0], "", exec_errno));
  }
  return child;
}

bool reap_bounded(pid_t pid, bool quiet_exit, std::chrono::steady_clock::time_point deadline,
                  int* status) {
  const bool in_time = wait_exited(pid, deadline);
  // Killed before it is reaped, so the group's id cannot have been reused.
  if (!in_time) ::kill(-pid, SIGKILL);
  reap_child(pid, quiet_exit, status);
  return in_time;
}

std::optional<Termination> termination(int wait_status) {
  if (WIFEXITED(wait_status)) return Termination{false, WEXITSTATUS(wait_status), 0};
  if (WIFSIGNALED(wait_status)) return Termination{true, 0, WTERMSIG(wait_status)};
  return std::nullopt;
}

int shell_exit_code(int wait_status) {
  const auto t = termination(wait_status);
  if (!t) return -1;
  return t->signaled ? 128 + t->signal : t->code;
}

RunResult run_bounded(ChildSpec spec, std::chrono::milliseconds timeout, std::size_t max_output) {
  RunResult r;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    r.error = describe_error("pipe2", "", errno);
    return r;
  }
  ScopedFd out_read(pipe_fds[0]), out_write(pipe_fds[1]);
  spec.output_fd = out_write.get();
  const pid_t pid = start_child(spec, &r.error);
  out_write.reset();  // EOF once the tool (and what it started) closed theirs
  if (pid < 0) return r;
  r.started = true;
  char buf[4096];
  bool eof = false;
  while (!eof && wait_readable(out_read.get(), deadline)) {
    const ssize_t got = ::read(out_read.get(), buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    eof = got <= 0;
    if (eof) break;
    // Past the limit it is still read (and dropped): a full pipe would
    // block the tool until the deadline.
    if (r.output.size() < max_output)
      r.output.append(buf, std::min(static_cast<std::size_t>(got), max_output - r.output.size()));
  }
  // Its output still open at the deadline: the tool, or something it left
  // running, holds it. The group goes (the tool, not yet reaped, still
  // holds the group's id).
  if (!eof) ::kill(-pid, SIGKILL);
  int status = 0;
  r.timed_out = !reap_bounded(pid, spec.quiet_exit, deadline, &status) || !eof;
  r.exit_code = shell_exit_code(status);
  return r;
}

}  // namespace ddprun::base
