#include "tests/agent/ddprun_process.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "base/pidfd.h"

extern char** environ;

namespace ddprun::testing {
namespace {

using Clock = std::chrono::steady_clock;

int remaining_ms(Clock::time_point until) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

}  // namespace

DdprunProcess::DdprunProcess(std::vector<std::string> args, std::vector<std::string> extra_env,
                             std::string program, bool own_group, bool stderr_to_stdout) {
  base::Pipe out = base::make_pipe(), err = base::make_pipe();
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  // An extra "KEY=VALUE" replaces the test's own KEY (getenv takes the first).
  for (auto& e : extra_env) {
    const std::string key = e.substr(0, e.find('=') + 1);
    env.erase(std::remove_if(env.begin(), env.end(),
                             [&](const std::string& kv) { return kv.rfind(key, 0) == 0; }),
              env.end());
    env.push_back(e);
  }
  args.insert(args.begin(), program);
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_ = fork();
  if (pid_ == 0) {
    if (own_group) setpgid(0, 0);
    dup2(out.write.get(), STDOUT_FILENO);
    dup2(stderr_to_stdout ? out.write.get() : err.write.get(), STDERR_FILENO);
    execve(program.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  if (own_group) setpgid(pid_, pid_);  // whoever runs first; kill(-pid) needs it
  out_fd_ = std::move(out.read);
  if (!stderr_to_stdout) err_fd_ = std::move(err.read);
}

DdprunProcess::~DdprunProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    wait_child(pid_, Seconds(10), nullptr);
  }
}

bool DdprunProcess::pump(Clock::time_point until) {
  pollfd fds[2];
  int n = 0;
  if (out_fd_ && !stall_out_) fds[n++] = {out_fd_.get(), POLLIN, 0};
  if (err_fd_) fds[n++] = {err_fd_.get(), POLLIN, 0};
  if (n == 0) return false;
  int r = poll(fds, n, remaining_ms(until));
  if (r <= 0) return true;
  char buf[65536];
  for (int i = 0; i < n; ++i) {
    if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    ssize_t got = read(fds[i].fd, buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    bool is_out = fds[i].fd == out_fd_.get();
    if (got <= 0) {
      (is_out ? out_fd_ : err_fd_).reset();
      continue;
    }
    (is_out ? out_ : err_).append(buf, static_cast<size_t>(got));
  }
  return out_fd_.valid() || err_fd_.valid();
}

bool DdprunProcess::wait_for_stdout(const std::function<bool(const std::string&)>& ready,
                                    Seconds deadline) {
  auto until = Clock::now() + deadline;
  while (!ready(out_)) {
    if (Clock::now() >= until || !pump(until)) return ready(out_);
  }
  return true;
}

bool DdprunProcess::wait_for_stderr(const std::function<bool(const std::string&)>& ready,
                                    Seconds deadline) {
  auto until = Clock::now() + deadline;
  while (!ready(err_)) {
    if (Clock::now() >= until || !pump(until)) return ready(err_);
  }
  return true;
}

void DdprunProcess::send(int sig) { kill(pid_, sig); }

Finished DdprunProcess::finish(Seconds deadline) {
  Finished f;
  auto until = Clock::now() + deadline;
  while (Clock::now() < until && pump(until)) {
  }
  if (out_fd_ || err_fd_) {
    f.timed_out = true;
    kill(pid_, SIGKILL);
  }
  int status = 0;
  if (wait_child(pid_, f.timed_out ? Seconds(10) : deadline, &status)) {
    f.status = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  } else {
    f.timed_out = true;
    kill(pid_, SIGKILL);
    wait_child(pid_, Seconds(10), &status);
  }
  pid_ = -1;
  f.out = out_;
  f.err = err_;
  return f;
}

Finished run_ddprun(std::vector<std::string> args, std::vector<std::string> extra_env,
                    Seconds deadline) {
  DdprunProcess p(std::move(args), std::move(extra_env));
  return p.finish(deadline);
}

std::vector<std::string> sanitizers_leave_segv() {
  auto with = [](const char* name) {
    const char* own = std::getenv(name);
    return std::string(name) + "=" + (own ? std::string(own) + " " : "") + "handle_segv=0";
  };
  return {with("TSAN_OPTIONS"), with("ASAN_OPTIONS")};
}

bool wait_child(pid_t pid, Seconds deadline, int* status) {
  if (!wait_dead(pid, deadline)) return false;
  int st = 0;
  pid_t r;
  do {
    r = waitpid(pid, &st, 0);
  } while (r < 0 && errno == EINTR);
  if (status) *status = st;
  return r == pid;
}

bool wait_dead(pid_t pid, Seconds deadline) {
  return base::wait_exited(pid, Clock::now() + deadline);
}

std::vector<std::string> lines_with(const std::string& text, const std::string& prefix) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(pos, nl - pos);
    if (line.rfind(prefix, 0) == 0) out.push_back(line);
    pos = nl + 1;
  }
  return out;
}

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos;
       pos = text.find(needle, pos + needle.size()))
    ++n;
  return n;
}

long field(const std::string& line, const std::string& key) {
  std::string k = " " + key + "=";
  std::string padded = " " + line;
  size_t pos = padded.find(k);
  if (pos == std::string::npos) {
    k = ":" + key + "=";
    pos = padded.find(k);
    if (pos == std::string::npos) return -1;
  }
  return std::strtol(padded.c_str() + pos + k.size(), nullptr, 10);
}

}  // namespace ddprun::testing
