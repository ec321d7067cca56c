// How a worker ended, and how that maps to ddprun's own exit status.
//
// A worker's wait status becomes an ExitStatus in one place (from_wait, on
// base::termination, the tree's one reader of the W* macros) and a
// shell-style code in one place (shell_code), the way ninja's
// exit_status.h does it.
#pragma once

#include <string>

namespace ddprun::agent {

struct ExitStatus {
  // True when the process was killed by a signal; then `signal` is set and
  // `code` is meaningless.
  bool signaled = false;
  int code = 0;
  int signal = 0;

  static ExitStatus from_wait(int wait_status);
  static ExitStatus exited(int code) { return {false, code, 0}; }
  static ExitStatus killed(int sig) { return {true, 0, sig}; }

  bool success() const { return !signaled && code == 0; }
  // "exit code 3" or "signal SIGKILL".
  std::string describe() const;
  // The status a shell would report: the code, or 128 + signal number.
  int shell_code() const { return signaled ? 128 + signal : code; }
};

// "SIGKILL" for 9; "SIG<n>" for numbers without a name.
std::string signal_name(int sig);
// Parses "SIGTERM", "TERM" or "15"; returns 0 when unknown.
int parse_signal(const std::string& name);

}  // namespace ddprun::agent
