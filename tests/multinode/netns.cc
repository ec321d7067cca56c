#include "tests/multinode/netns.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "base/pidfd.h"

extern char** environ;

namespace ddprun::testing {
namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kIp = "/usr/sbin/ip";
constexpr const char* kPrefix = "ddmn-";

int left_ms(Clock::time_point until) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
  return ms > 0 ? static_cast<int>(ms) : 0;
}

// Waits for our child `pid` on a pidfd until the deadline.
bool wait_pid(pid_t pid, Clock::time_point until, int* status) {
  if (!base::wait_exited(pid, until)) return false;
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (status) *status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return true;
}

}  // namespace

int run_command(const std::vector<std::string>& argv, std::string* output) {
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return -1;
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pipefd[1], STDOUT_FILENO);
    dup2(pipefd[1], STDERR_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  close(pipefd[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(pipefd[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(buf, n);
  }
  close(pipefd[0]);
  int status = -1;
  wait_pid(pid, Clock::now() + Seconds(30), &status);
  if (output) *output = out;
  return status;
}

std::string netns_unavailable() {
  if (geteuid() != 0) return "not root (creating network namespaces needs root)";
  std::string name = std::string(kPrefix) + std::to_string(getpid()) + "-probe";
  std::string out;
  if (run_command({kIp, "netns", "add", name}, &out) != 0)
    return "`ip netns add` failed: " + out;
  run_command({kIp, "netns", "del", name});
  return "";
}

void remove_stale_namespaces() {
  DIR* d = opendir("/run/netns");
  if (!d) return;
  std::vector<std::string> stale;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind(kPrefix, 0) != 0) continue;
    pid_t pid = static_cast<pid_t>(std::atoi(name.c_str() + strlen(kPrefix)));
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) stale.push_back(name);
  }
  closedir(d);
  for (const auto& name : stale) run_command({kIp, "netns", "del", name});
}

Netns::Netns(const std::string& test, int nodes)
    : tag_(std::string(kPrefix) + std::to_string(getpid()) + "-" + test) {
  const std::string hub = tag_ + "-hub";
  ip({"netns", "add", hub});
  created_.push_back(hub);
  ip({"-n", hub, "link", "add", "br0", "type", "bridge"});
  ip({"-n", hub, "link", "set", "br0", "up"});
  for (int i = 1; i <= nodes; ++i) {
    ip({"netns", "add", ns(i)});
    created_.push_back(ns(i));
    const std::string v = "v" + std::to_string(i);
    ip({"-n", hub, "link", "add", v, "type", "veth", "peer", "name", "eth0", "netns", ns(i)});
    ip({"-n", hub, "link", "set", v, "master", "br0", "up"});
    ip({"-n", ns(i), "addr", "add", addr(i) + "/24", "dev", "eth0"});
    ip({"-n", ns(i), "link", "set", "eth0", "up"});
    ip({"-n", ns(i), "link", "set", "lo", "up"});
  }
}

Netns::~Netns() {
  // Deleting a namespace removes its end of each veth pair, and the peer.
  for (auto it = created_.rbegin(); it != created_.rend(); ++it)
    run_command({kIp, "netns", "del", *it});
}

void Netns::ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv{kIp};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string out;
  if (run_command(argv, &out) != 0) {
    std::string cmd;
    for (const auto& a : argv) cmd += a + " ";
    throw std::runtime_error("`" + cmd + "` failed: " + out);
  }
}

void Netns::cut(int node) { ip({"-n", ns(node), "link", "set", "eth0", "down"}); }

void Netns::partition(int node) {
  ip({"-n", tag_ + "-hub", "link", "set", "v" + std::to_string(node), "nomaster"});
}

void Netns::add_address(int node, const std::string& addr) {
  ip({"-n", ns(node), "addr", "add", addr + "/24", "dev", "eth0"});
}

void Netns::heal(int node) {
  ip({"-n", tag_ + "-hub", "link", "set", "v" + std::to_string(node), "master", "br0"});
}

NodeAgent::NodeAgent(const std::string& netns, const std::vector<std::string>& args,
                     const std::vector<std::string>& extra_env, std::string log,
                     const std::string& program)
    : log_(std::move(log)) {
  int nsfd = netns.empty() ? -1 : open(("/run/netns/" + netns).c_str(), O_RDONLY | O_CLOEXEC);
  if (!netns.empty() && nsfd < 0) throw std::runtime_error("cannot open namespace " + netns);
  int logfd = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  std::vector<std::string> argv_s{program};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) env_s.emplace_back(*e);
  env_s.insert(env_s.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> argv, envp;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    if (nsfd >= 0 && setns(nsfd, CLONE_NEWNET) != 0) _exit(125);
    dup2(logfd, STDOUT_FILENO);
    dup2(logfd, STDERR_FILENO);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  if (nsfd >= 0) close(nsfd);
  close(logfd);
  if (pid_ < 0) throw std::runtime_error("fork failed");
}

NodeAgent::~NodeAgent() { kill_now(); }

void NodeAgent::kill_now() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  wait_pid(pid_, Clock::now() + Seconds(10), nullptr);
  pid_ = -1;
}

void NodeAgent::signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

int NodeAgent::wait(Seconds deadline) {
  if (pid_ <= 0) return -1;
  int status = -1;
  if (!wait_pid(pid_, Clock::now() + deadline, &status)) {
    kill_now();
    return -1;
  }
  pid_ = -1;
  return status;
}

std::string NodeAgent::log() const {
  std::ifstream f(log_);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

int Record::num(const std::string& key) const {
  auto it = env.find(key);
  return it == env.end() || it->second.empty() ? -1 : std::atoi(it->second.c_str());
}

std::vector<Record> read_records(const std::string& dir) {
  std::vector<Record> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::string name = entry.path().filename();
    auto r = name.find(".r"), l = name.find(".l");
    bool partial = name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0;
    if (r == std::string::npos || l == std::string::npos || partial ||
        name.find(".log") != std::string::npos)
      continue;
    Record rec;
    rec.node = name.substr(0, r);
    rec.round = std::atoi(name.c_str() + r + 2);
    std::ifstream f(entry.path());
    for (std::string line; std::getline(f, line);) {
      auto eq = line.find('=');
      if (eq != std::string::npos) rec.env[line.substr(0, eq)] = line.substr(eq + 1);
    }
    out.push_back(std::move(rec));
  }
  return out;
}

bool wait_records(const std::string& dir,
                  const std::function<bool(const std::vector<Record>&)>& ready, Seconds deadline) {
  return wait_in_dir(dir, [&] { return ready(read_records(dir)); }, deadline);
}

bool wait_in_dir(const std::string& dir, const std::function<bool()>& ready, Seconds deadline) {
  const auto until = Clock::now() + deadline;
  int fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  inotify_add_watch(fd, dir.c_str(), IN_MOVED_TO | IN_CLOSE_WRITE | IN_CREATE | IN_MODIFY);
  bool ok = false;
  for (;;) {
    if (ready()) {
      ok = true;
      break;
    }
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, left_ms(until)) <= 0) break;
    char buf[8192];
    while (read(fd, buf, sizeof buf) > 0) {
    }
  }
  close(fd);
  return ok;
}

}  // namespace ddprun::testing
