// ddprun-store as a real child process on 127.0.0.1, for tests that need
// its exit status, its environment handling or its resident memory.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/temp_dir.h"

extern char** environ;

namespace ddprun::rendezvous::testing {

class StoreProcess {
 public:
  // Starts `bin --host 127.0.0.1 --port 0 args...` with `env` added to this
  // process's environment (a "NAME" entry without '=' removes NAME); its
  // output goes to a log file.
  StoreProcess(const std::string& bin, std::vector<std::string> args,
               const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv = {bin, "--host", "127.0.0.1", "--port", "0"};
    argv.insert(argv.end(), args.begin(), args.end());
    start(std::move(argv), env);
  }
  // Another store server (bench/tcpstore_server.py) run as `argv` exactly;
  // it too prints "listening on 127.0.0.1:PORT".
  struct Command {
    std::vector<std::string> argv;
  };
  explicit StoreProcess(Command c, const std::vector<std::string>& env = {}) {
    start(std::move(c.argv), env);
  }
  ~StoreProcess() {
    if (pid_ > 0 && !status_) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
  }
  StoreProcess(const StoreProcess&) = delete;
  StoreProcess& operator=(const StoreProcess&) = delete;

  // The port from the "listening on" line; nullopt if the store exited or
  // did not print it within `limit`.
  std::optional<uint16_t> port(std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    static const std::regex kListening("listening on 127\\.0\\.0\\.1:([0-9]+)");
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      std::smatch m;
      std::string text = log();
      if (std::regex_search(text, m, kListening)) return static_cast<uint16_t>(std::stoi(m[1]));
      if (exited()) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling a file
    }
    return std::nullopt;
  }
  // The exit status once the store has exited within `limit`.
  std::optional<int> wait_exit(std::chrono::milliseconds limit) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (!exited() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // waitpid has no timeout
    }
    return status_;
  }
  // SIGTERM and the exit status (the store shuts down cleanly on it).
  std::optional<int> stop() {
    if (!status_) ::kill(pid_, SIGTERM);
    return wait_exit(std::chrono::seconds(10));
  }
  bool exited() {
    if (status_) return true;
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      return true;
    }
    return false;
  }
  std::string log() const {
    std::ifstream f(log_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  // Resident memory now (VmRSS), in bytes.
  size_t rss() const {
    std::ifstream f("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
    }
    return 0;
  }
  pid_t pid() const { return pid_; }

 private:
  void start(std::vector<std::string> argv, const std::vector<std::string>& env) {
    std::vector<std::string> envv;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string entry = *e;
      bool replaced = false;
      for (const auto& x : env) {
        std::string name = x.substr(0, x.find('='));
        if (entry.rfind(name + "=", 0) == 0) replaced = true;
      }
      if (!replaced) envv.push_back(entry);
    }
    for (const auto& x : env) {
      if (x.find('=') != std::string::npos) envv.push_back(x);
    }
    log_ = dir_.file("store.log");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    std::vector<char*> a, e;
    for (auto& s : argv) a.push_back(s.data());
    a.push_back(nullptr);
    for (auto& s : envv) e.push_back(s.data());
    e.push_back(nullptr);
    int rc = posix_spawn(&pid_, argv[0].c_str(), &fa, nullptr, a.data(), e.data());
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) throw std::runtime_error("cannot start " + argv[0]);
  }

  ddprun::testing::TempDir dir_;
  std::string log_;
  pid_t pid_ = -1;
  std::optional<int> status_;
};

}  // namespace ddprun::rendezvous::testing
