// Helpers for the watchdog tests: a move-only child process owner that
// always kills and reaps, and an io_context runner with a deadline.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

#include "base/pidfd.h"
#include "tests/common/slurp.h"
#include "tests/common/temp_dir.h"
#include "tests/common/test_python.h"
#include "watchdog/heartbeat_server.h"

namespace ddprun::watchdog::testing {

// One datagram's meaning as the HeartbeatServer hands it on (a beat of
// `kind`, received at `t`).
inline Beat beat(int64_t rank, int64_t step, std::chrono::steady_clock::time_point t,
                 BeatKind kind = BeatKind::kExplicit, std::string section = {}) {
  Beat b;
  b.kind = kind;
  b.global_rank = rank;
  b.step = step;
  b.section = std::move(section);
  b.received = t;
  return b;
}

// Runs `io` until `done()` or `timeout`; returns done().
inline bool run_until(boost::asio::io_context& io, const std::function<bool()>& done,
                      std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  io.restart();
  while (!done()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    io.run_one_for(deadline - now);
    if (io.stopped()) io.restart();
  }
  return true;
}

// A child process in its own process group; the group is killed (SIGKILL)
// and the child reaped on destruction.
class Child {
 public:
  // Spawns argv with the current environment plus `env` overrides. When
  // `capture_stdout`, stdout is a pipe readable via stdout_fd(); when
  // `stderr_path` / `stdout_path` is set, that stream goes to the file.
  Child(std::vector<std::string> argv, const std::map<std::string, std::string>& env = {},
        bool capture_stdout = false, const std::string& stderr_path = "",
        const std::string& stdout_path = "") {
    std::vector<std::string> envs;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      if (env.count(kv.substr(0, kv.find('=')))) continue;
      envs.push_back(kv);
    }
    for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
    std::vector<char*> cargv, cenv;
    for (auto& s : argv) cargv.push_back(s.data());
    cargv.push_back(nullptr);
    for (auto& s : envs) cenv.push_back(s.data());
    cenv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    int fds[2] = {-1, -1};
    if (capture_stdout) {
      if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
      posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    }
    if (!stdout_path.empty()) {
      posix_spawn_file_actions_addopen(&fa, 1, stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                       0644);
    }
    if (!stderr_path.empty()) {
      posix_spawn_file_actions_addopen(&fa, 2, stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                       0644);
    }
    // Own process group, so the destructor also kills what the child started.
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    const int rc = ::posix_spawnp(&pid_, cargv[0], &fa, &attr, cargv.data(), cenv.data());
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&fa);
    if (capture_stdout) {
      ::close(fds[1]);
      out_ = fds[0];
    }
    if (rc != 0) throw std::runtime_error("cannot spawn " + argv[0]);
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(-pid_, SIGKILL);
      wait();
    }
    if (out_ >= 0) ::close(out_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  int stdout_fd() const { return out_; }
  // Reaps; returns the raw wait status.
  int wait() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    return status;
  }
  // Waits at most `timeout`; on timeout the child is killed (and reaped)
  // and nullopt returned.
  std::optional<int> wait_for(std::chrono::milliseconds timeout) {
    if (!ddprun::base::wait_exited(pid_, std::chrono::steady_clock::now() + timeout)) {
      ::kill(pid_, SIGKILL);
      wait();
      return std::nullopt;
    }
    return wait();
  }
  // Reads stdout until `needle` appears or the deadline passes.
  bool wait_for_output(const std::string& needle,
                       std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (seen_.find(needle) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[512];
      const ssize_t n = ::read(out_, buf, sizeof(buf));
      if (n <= 0) return false;
      seen_.append(buf, static_cast<size_t>(n));
    }
    return true;
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::string seen_;
};

// True when `tool` is found on PATH (command -v through sh).
inline bool tool_installed(const std::string& tool) {
  Child probe({"sh", "-c", "command -v \"$0\" >/dev/null", tool});
  const int st = probe.wait();
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

// The helpers every component's tests share, named here too, so that one
// using-directive brings a watchdog test all it needs.
using ddprun::testing::slurp;
using ddprun::testing::TempDir;
using ddprun::testing::test_python;

}  // namespace ddprun::watchdog::testing
