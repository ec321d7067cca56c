// Helper programs run from ddprun's own code (nvidia-smi for doctor, attach's
// --on-hang command, the stack tools of a hang report): the one way to start
// one and the one way to wait for it, so each caller need not get the
// post-fork rules, the deadline and the reaping right again.
//
// start_child: argv[0] is looked up on PATH before the fork (find_program)
// and everything the child needs is built before it (after it only
// async-signal-safe calls, since callers have threads). The child gets a
// process group of its own (a deadline kills the tool's own children too),
// stdin from /dev/null, stdout and stderr to one descriptor, and default
// signal actions with an empty mask (reset_signals_for_exec). An exec failure comes back
// through a close-on-exec pipe as the errno, and that child is reaped.
// `quiet_exit` starts a "clone child" with no exit signal, which never
// execs (an exec would make it an ordinary child again): it runs the tool
// as its own child and exits with the tool's code. No SIGCHLD reaches the
// caller, and no waitpid(-1) of the agent's reaper can take its status;
// only reap_bounded (which passes __WCLONE) reaps it.
//
// run_bounded: start_child, its output captured up to a limit, a deadline
// for everything (a tool that closed its output early still gets only the
// rest of it); at the deadline its group is SIGKILLed. Always reaped; every
// descriptor closed on every path. Waits are on a pidfd and the pipe: no
// sleeping, no polling /proc.
//
// Thread safety: all functions may be called from any thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::base {

struct ChildSpec {
  std::vector<std::string> argv;       // argv[0]: a path, or a name on PATH
  std::vector<std::string> extra_env;  // NAME=VALUE, replacing ours of that NAME
  int output_fd = -1;                  // the child's stdout and stderr; -1: /dev/null
  bool quiet_exit = false;             // no SIGCHLD (see above)
};

// The executable `name` names: itself when it holds a '/', else the first
// executable regular file of that name in `path_env` (a PATH value; empty:
// /usr/local/bin:/usr/bin:/bin). Empty when there is none.
std::string find_program(const std::string& name, const std::string& path_env);

// The null-terminated char* array execve takes, pointing into `strings`
// (which must outlive it and stay unchanged): built before a fork.
std::vector<char*> exec_array(const std::vector<std::string>& strings);

// In a forked child just before execve (async-signal-safe): every signal's
// action back to its default and an empty signal mask. Ignored signals and
// the mask survive exec, so without this a program started by a thread that
// blocks SIGTERM, or by a process that ignores SIGPIPE, inherits that. The
// agent's workers (agent/spawn.cc) and start_child both call it.
void reset_signals_for_exec();

// The child's pid, or -1 with *error one line saying why ("nvidia-smi: not
// found in PATH", "/x: Permission denied", "fork: ...").
pid_t start_child(const ChildSpec& spec, std::string* error);

// Reaps `pid` (started by start_child with the same `quiet_exit`), which has
// exited or is being killed: waitpid, __WCLONE for a quiet child, retried
// on EINTR. *status (when given) gets the wait status.
void reap_child(pid_t pid, bool quiet_exit, int* status);

// Waits for `pid` (started by start_child with the same `quiet_exit`) until
// `deadline`, then SIGKILLs its group if it is still running; reaps it.
// True when it exited by itself in time; *status gets the wait status.
bool reap_bounded(pid_t pid, bool quiet_exit, std::chrono::steady_clock::time_point deadline,
                  int* status);

// A child's end, decoded from a wait status: the one place the tree reads
// the W* macros (agent::ExitStatus, shell_exit_code and the helpers' checks
// build on it). Empty for a stop or continue report: nothing in ddprun
// waits with WUNTRACED or WCONTINUED, so such a status is a caller's bug.
struct Termination {
  bool signaled = false;
  int code = 0;    // exited: its exit code
  int signal = 0;  // signaled: the signal that killed it
  bool success() const { return !signaled && code == 0; }
};
std::optional<Termination> termination(int wait_status);

// A wait status as a shell shows it: the exit code, or 128+N for signal N.
int shell_exit_code(int wait_status);

struct RunResult {
  bool started = false;    // false: it could not be started (error says why)
  bool timed_out = false;  // killed at the deadline
  int exit_code = -1;      // shell_exit_code of its wait status
  std::string output;      // stdout and stderr together, at most max_output bytes
  std::string error;
};

// Runs `spec` (its output_fd is ignored: the output is captured) for at
// most `timeout`.
RunResult run_bounded(ChildSpec spec, std::chrono::milliseconds timeout,
                      std::size_t max_output = 64 * 1024);

}  // namespace ddprun::base
