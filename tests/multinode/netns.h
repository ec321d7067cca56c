// Test fixtures for multi-node runs on one machine: network namespaces
// joined by veth pairs to a bridge, and ddprun agents started inside them.
// Both are RAII owners: whatever a test creates is removed or killed when
// the owner goes away, even when the test fails.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tests/common/temp_dir.h"

namespace ddprun::testing {

using Seconds = std::chrono::seconds;

// Runs a program (no shell) and waits; returns its exit status, or -1.
int run_command(const std::vector<std::string>& argv, std::string* output = nullptr);

// Namespaces "<tag>-hub" (a bridge) and "<tag>-n1".."<tag>-nN", node i with
// eth0 = 10.77.0.i/24 and lo up. The tag carries our pid so parallel test
// processes never clash. Throws std::runtime_error naming the failed step.
class Netns {
 public:
  Netns(const std::string& test, int nodes);
  ~Netns();
  Netns(const Netns&) = delete;
  Netns& operator=(const Netns&) = delete;

  std::string ns(int node) const { return tag_ + "-n" + std::to_string(node); }
  static std::string addr(int node) { return "10.77.0." + std::to_string(node); }
  // Cuts node's only link (ip link set eth0 down inside its namespace).
  void cut(int node);
  // Partitions node from the others without any local error: its veth's
  // hub end leaves the bridge, so every packet it sends or is sent is
  // dropped silently (a failed switch port). heal() puts it back.
  void partition(int node);
  void heal(int node);
  // Adds another address (A.B.C.D, /24) to node's eth0.
  void add_address(int node, const std::string& addr);

 private:
  void ip(const std::vector<std::string>& args);
  std::string tag_;
  std::vector<std::string> created_;
};

// Deletes namespaces "ddmn-<pid>-*" whose test process is gone.
void remove_stale_namespaces();
// Empty when this process may create namespaces; otherwise why not.
std::string netns_unavailable();

// A ddprun agent inside a namespace ("" = this one); stdout+stderr go to `log`. The agent
// gets PR_SET_PDEATHSIG=SIGKILL, so a killed test leaves nothing behind;
// the destructor SIGKILLs and reaps it (its workers die with it).
class NodeAgent {
 public:
  NodeAgent(const std::string& netns, const std::vector<std::string>& args,
            const std::vector<std::string>& extra_env, std::string log,
            const std::string& program = DDPRUN_BIN);
  ~NodeAgent();
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

  void kill_now();  // SIGKILL and reap
  void signal(int sig);
  // Exit status (exit code, or 128+signal); -1 when the deadline passed
  // (then it is SIGKILLed).
  int wait(Seconds deadline);
  std::string log() const;

 private:
  pid_t pid_ = -1;
  std::string log_;
};

// One worker's file: <node>.r<round>.l<local_rank> holding KEY=VALUE lines.
struct Record {
  std::string node;
  int round = -1;
  std::map<std::string, std::string> env;
  int num(const std::string& key) const;
};
std::vector<Record> read_records(const std::string& dir);

// Waits, with inotify on `dir`, until `ready(records)` holds; false on the
// deadline.
bool wait_records(const std::string& dir, const std::function<bool(const std::vector<Record>&)>& ready,
                  Seconds deadline);

// Waits, with inotify on `dir` (files created, written or renamed), until
// `ready()` holds; false on the deadline.
bool wait_in_dir(const std::string& dir, const std::function<bool()>& ready, Seconds deadline);

}  // namespace ddprun::testing
