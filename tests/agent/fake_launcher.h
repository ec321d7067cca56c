// A fake ProcessLauncher (agent/process_launcher.h) for Attempt's unit
// tests: no process is started; each "worker" answers a signal as a real one
// would (ends by it, or ignores it when told to), and its exit waits in a
// queue until the test reaps it, as the agent's SIGCHLD reaper would. Every
// signal is logged, so a test reads back what the teardown sent, to whom
// and in which order. A worker's inherited descriptors (the recovery
// channel's end, SpawnRequest::inherit_fds) are kept open for the test,
// which then speaks for the worker (channel()).
#pragma once

#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "agent/attempt.h"
#include "agent/process_launcher.h"
#include "base/scoped_fd.h"

namespace ddprun::agent::test {

// Wait statuses as waitpid(2) reports them.
inline int exited_with(int code) { return (code & 0xff) << 8; }
inline int killed_by(int sig) { return sig & 0x7f; }

struct SentSignal {
  int worker;  // index in spawn order
  int sig;
  bool group;
  bool operator==(const SentSignal& o) const {
    return worker == o.worker && sig == o.sig && group == o.group;
  }
};

class FakeLauncher : public ProcessLauncher {
 public:
  // Far above any pid_max: never a real process.
  static constexpr pid_t kFirstPid = 1 << 26;

  // Spawn number `n` (from 0) fails as a missing program does.
  std::optional<int> fail_spawn_at;
  // Spawn number `n` is forked but its exec fails: finish() throws (the
  // child is reaped there, as PosixLauncher does).
  std::optional<int> fail_exec_at;
  std::vector<pid_t> finished;  // finish() calls, in order
  std::vector<SpawnRequest> requests;
  std::vector<SentSignal> sent;
  std::vector<pid_t> released;
  int kill_job_calls = 0;
  int sweeps = 0;

  pid_t pid_of(int worker) const { return kFirstPid + worker; }
  // The worker stays alive through `sig` (a handler, SIG_IGN; for SIGKILL
  // a process stuck in the kernel).
  void ignore(int worker, int sig) { ignored_[worker].insert(sig); }
  // Spawn number `worker` leaves its stdout and stderr open after it exits,
  // as a grandchild or daemon that inherited them would.
  void hold_streams(int worker) { held_workers_.insert(worker); }
  // Spawn number `worker`'s end of its recovery channel (rank scope); -1
  // when it got none.
  int channel(int worker) const {
    auto it = channels_.find(worker);
    return it == channels_.end() ? -1 : it->second.get();
  }
  // The holder of those streams ends.
  void drop_streams() { held_.clear(); }
  // Held spawn `worker`'s stdout (the write end): the test writes there for
  // it; -1 when not held.
  int held_stdout(int worker) const {
    auto it = held_.find(worker);
    return it == held_.end() ? -1 : it->second.first.get();
  }
  // From now on `worker` looks idle (asleep, no CPU) to idle(); the others
  // look busy, as a rank printing its traceback does.
  void set_idle(int worker) { idle_.insert(worker); }
  // The worker ends on its own; its exit waits for reap().
  void exit(int worker, int wait_status) {
    if (!alive_.count(worker)) return;
    alive_.erase(worker);
    exits_.emplace_back(pid_of(worker), wait_status);
    channels_.erase(worker);  // its end closes with the process
  }
  // Hands every queued exit to `attempt` in order, as the agent does.
  void reap(Attempt& attempt) {
    while (!exits_.empty()) {
      auto [pid, status] = exits_.front();
      exits_.erase(exits_.begin());
      attempt.on_exit(pid, status);
    }
  }
  bool alive(int worker) const { return alive_.count(worker) > 0; }
  // Signals sent to `worker`, in order.
  std::vector<int> signals_to(int worker) const {
    std::vector<int> out;
    for (const auto& s : sent)
      if (s.worker == worker) out.push_back(s.sig);
    return out;
  }

  pid_t spawn(SpawnRequest request) override {
    const int n = static_cast<int>(requests.size());
    if (fail_spawn_at && *fail_spawn_at == n)
      throw SpawnError("cannot execute '" + request.path + "': No such file or directory", ENOENT,
                       true);
    if (held_workers_.count(n)) {
      held_.emplace(n, std::make_pair(base::ScopedFd(::dup(request.stdout_fd)),
                                      base::ScopedFd(::dup(request.stderr_fd))));
    }
    if (!request.inherit_fds.empty()) channels_[n] = base::ScopedFd(::dup(request.inherit_fds[0]));
    requests.push_back(std::move(request));
    alive_.insert(n);
    return pid_of(n);
  }
  void finish(pid_t pid) override {
    finished.push_back(pid);
    const int n = pid - kFirstPid;
    if (fail_exec_at && *fail_exec_at == n) {
      alive_.erase(n);
      throw SpawnError("cannot execute '/bin/true': Text file busy", ETXTBSY, true);
    }
  }
  void signal(pid_t pid, int sig) override { deliver(pid, sig, false); }
  void signal_group(pid_t pgid, int sig) override { deliver(pgid, sig, true); }
  void kill_job() override { ++kill_job_calls; }
  void sweep_leftovers() override { ++sweeps; }
  void release(pid_t pgid) override { released.push_back(pgid); }
  bool idle(pid_t pid) override { return idle_.count(pid - kFirstPid) > 0; }

 private:
  void deliver(pid_t pid, int sig, bool group) {
    const int worker = pid - kFirstPid;
    sent.push_back({worker, sig, group});
    // Job control and window changes do not end a process.
    if (sig == SIGCONT || sig == SIGSTOP || sig == SIGWINCH) return;
    if (ignored_[worker].count(sig)) return;
    exit(worker, killed_by(sig));
  }

  std::set<int> alive_;
  std::set<int> idle_;
  std::set<int> held_workers_;
  std::map<int, std::pair<base::ScopedFd, base::ScopedFd>> held_;  // stdout, stderr
  std::map<int, std::set<int>> ignored_;
  std::map<int, base::ScopedFd> channels_;
  std::vector<std::pair<pid_t, int>> exits_;
};

}  // namespace ddprun::agent::test
