// Test helper: run real rank processes with a deadline.
//
// Spawn a program with extra environment, stdout+stderr captured to a file,
// in its own process group. wait_for() polls a pidfd with the remaining
// deadline (no sleeps); on timeout or destruction the whole group is killed
// and reaped, so a failing test leaves nothing running.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tests/common/loopback_port.h"

extern char** environ;

namespace ddprun::trainer::testing {

class Process {
 public:
  // `inherit`: {descriptor here, number in the child} pairs the child gets
  // (dup2, so close-on-exec ends are fine; the numbers must differ).
  Process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
          const std::string& log_path, const std::vector<std::pair<int, int>>& inherit = {})
      : log_path_(log_path) {
    std::vector<std::string> envs;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string kv = *e;
      if (env.count(kv.substr(0, kv.find('='))) == 0) envs.push_back(kv);
    }
    for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
    std::vector<char*> cargv, cenv;
    for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    for (const auto& e : envs) cenv.push_back(const_cast<char*>(e.c_str()));
    cenv.push_back(nullptr);

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    for (const auto& [here, there] : inherit) posix_spawn_file_actions_adddup2(&fa, here, there);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    const int rc = posix_spawn(&pid_, cargv[0], &fa, &attr, cargv.data(), cenv.data());
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) throw std::runtime_error("posix_spawn " + argv[0] + " failed");
    pidfd_ = int(::syscall(SYS_pidfd_open, pid_, 0));
    if (pidfd_ < 0) {
      kill_and_reap();
      throw std::runtime_error("pidfd_open failed");
    }
  }
  ~Process() { kill_and_reap(); }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  // Exit code (128+signal when killed by one); -1 when the deadline passed
  // (the group is then killed).
  int wait_for(std::chrono::steady_clock::time_point deadline) {
    if (exited_) return status_;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        kill_and_reap();
        return -1;
      }
      pollfd p{pidfd_, POLLIN, 0};
      const int n = ::poll(&p, 1, int(left.count()));
      if (n > 0) break;
    }
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    exited_ = true;
    ::kill(-pid_, SIGKILL);  // stragglers of its group
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return status_;
  }

  // The pidfd: readable once the process exited (for a poll over several).
  int pidfd() const { return pidfd_; }

  // Sends `sig` to the process itself (not its group).
  void signal(int sig) {
    if (!exited_) ::kill(pid_, sig);
  }

  std::string output() const {
    std::ifstream in(log_path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  void kill_and_reap() {
    if (pid_ > 0 && !exited_) {
      ::kill(-pid_, SIGKILL);
      int st;
      while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
      exited_ = true;
      status_ = -1;
    }
    if (pidfd_ >= 0) ::close(pidfd_);
    pidfd_ = -1;
  }

  std::string log_path_;
  pid_t pid_ = -1;
  int pidfd_ = -1;
  bool exited_ = false;
  int status_ = -1;
};

// A port the kernel just handed out (closed again; tests bind it next).
inline int free_port() { return ddprun::testing::free_loopback_port(); }

// Runs `world` ranks of argv with torchrun's environment; returns each
// rank's exit code and output.
struct RankRun {
  std::vector<int> codes;
  std::vector<std::string> outputs;
};

inline RankRun run_ranks_once(const std::vector<std::string>& argv, int world,
                              const std::string& log_prefix, std::chrono::seconds limit,
                              const std::map<std::string, std::string>& extra_env) {
  const std::string port = std::to_string(free_port());
  std::vector<std::unique_ptr<Process>> procs;
  for (int r = 0; r < world; ++r) {
    std::map<std::string, std::string> env = extra_env;
    env["RANK"] = env["LOCAL_RANK"] = std::to_string(r);
    env["WORLD_SIZE"] = env["LOCAL_WORLD_SIZE"] = std::to_string(world);
    env["MASTER_ADDR"] = "127.0.0.1";
    env["MASTER_PORT"] = port;
    env["OMP_NUM_THREADS"] = "1";
    procs.push_back(std::make_unique<Process>(argv, env,
                                              log_prefix + ".rank" + std::to_string(r) + ".log"));
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  RankRun out;
  for (auto& p : procs) {
    out.codes.push_back(p->wait_for(deadline));
    out.outputs.push_back(p->output());
  }
  return out;
}

// free_port()'s port was closed before rank 0's TCPStore binds it, so another
// test's connection can take it meanwhile (EADDRINUSE, seen under ctest -j2):
// such a run is repeated on a fresh port, twice at most.
inline RankRun run_ranks(const std::vector<std::string>& argv, int world,
                         const std::string& log_prefix, std::chrono::seconds limit,
                         std::map<std::string, std::string> extra_env = {}) {
  for (int tries = 1;; ++tries) {
    RankRun run = run_ranks_once(argv, world, log_prefix, limit, extra_env);
    bool port_taken = false;
    for (const auto& o : run.outputs)
      port_taken = port_taken || o.find("Address already in use") != std::string::npos;
    if (!port_taken || tries == 3) return run;
  }
}

}  // namespace ddprun::trainer::testing
