// Runs the real ddprun binary for a test: pipes for stdout and stderr, every
// wait bounded by a deadline, and whatever is still running SIGKILLed and
// reaped when the object goes away.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "base/scoped_fd.h"

namespace ddprun::testing {

using Seconds = std::chrono::seconds;

struct Finished {
  int status = -1;  // shell-style: exit code, or 128+signal
  bool timed_out = false;
  std::string out;
  std::string err;
};

class DdprunProcess {
 public:
  // Starts `program args...` (ddprun itself unless `program` is given) with
  // the test's environment plus `extra_env` ("KEY=VALUE"). `own_group`:
  // in a process group of its own, as a shell starts a job.
  // `stderr_to_stdout`: one pipe for both, as `ddprun ... 2>&1 | reader`.
  explicit DdprunProcess(std::vector<std::string> args, std::vector<std::string> extra_env = {},
                         std::string program = DDPRUN_BIN, bool own_group = false,
                         bool stderr_to_stdout = false);
  ~DdprunProcess();
  DdprunProcess(const DdprunProcess&) = delete;
  DdprunProcess& operator=(const DdprunProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Reads output until `ready(stdout)` holds or the deadline passes.
  bool wait_for_stdout(const std::function<bool(const std::string&)>& ready, Seconds deadline);
  bool wait_for_stderr(const std::function<bool(const std::string&)>& ready, Seconds deadline);
  // While stalled, ddprun's stdout is not read: a console nobody reads.
  void stall_stdout(bool stalled) { stall_out_ = stalled; }
  void send(int sig);
  // Standard output read so far.
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }
  // Reads both streams to EOF and reaps ddprun. On the deadline ddprun is
  // SIGKILLed and timed_out is set.
  Finished finish(Seconds deadline);

 private:
  bool pump(std::chrono::steady_clock::time_point until);  // false at EOF of both

  pid_t pid_ = -1;
  base::ScopedFd out_fd_;
  base::ScopedFd err_fd_;
  std::string out_, err_;
  bool stall_out_ = false;
};

// Runs ddprun to the end.
Finished run_ddprun(std::vector<std::string> args, std::vector<std::string> extra_env = {},
                    Seconds deadline = Seconds(60));

// Extra environment for a job whose worker a test kills with SIGSEGV on
// purpose: in the sanitizer builds (scripts/test-sanitizer.sh) the worker's
// SEGV handler would catch the signal and exit 66 instead of dying by it, so
// it is turned off (handle_segv=0, kept after the run's own options). The
// plain build ignores both variables.
std::vector<std::string> sanitizers_leave_segv();

// True once `pid` has died (exited or zombie), waiting on a pidfd up to the
// deadline; reaps it if it is our child.
bool wait_dead(pid_t pid, Seconds deadline);

// Waits for our child `pid` to exit and reaps it; false on the deadline.
bool wait_child(pid_t pid, Seconds deadline, int* status);

// Lines of `text` that start with `prefix`.
std::vector<std::string> lines_with(const std::string& text, const std::string& prefix);
// Count of non-overlapping occurrences of `needle`.
size_t count_of(const std::string& text, const std::string& needle);
// Value of `key=` in a "k=v k=v" line, or -1.
long field(const std::string& line, const std::string& key);

}  // namespace ddprun::testing
