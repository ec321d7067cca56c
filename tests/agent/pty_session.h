// Runs ddprun on a real pseudo-terminal for a test, as a shell in a terminal
// window would: ddprun is a session leader whose controlling terminal is
// the pty, in its foreground process group, so typed Ctrl-Z becomes
// SIGTSTP. The test types on the master side and reads the screen's bytes.
// Every wait has a deadline; ddprun is SIGKILLed and reaped at the end.
#pragma once

#include <sys/ioctl.h>
#include <sys/types.h>
#include <termios.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace ddprun::testing {

class PtySession {
 public:
  // ddprun `args...` on a terminal of `cols` columns.
  explicit PtySession(std::vector<std::string> args, unsigned short cols = 100);
  ~PtySession();
  PtySession(const PtySession&) = delete;
  PtySession& operator=(const PtySession&) = delete;

  pid_t pid() const { return pid_; }
  // Reads the terminal until `ready(screen)` holds or `deadline` passes;
  // `on_read` (optional) runs after each read, for timing.
  bool wait_for(const std::function<bool(const std::string&)>& ready,
                std::chrono::milliseconds deadline);
  // Types `bytes` at the terminal.
  void type(const std::string& bytes);
  const std::string& screen() const { return screen_; }
  // The terminal's modes as ddprun sees them (tcgetattr of the master gives
  // the slave's), and as they were before ddprun started.
  termios modes() const;
  const termios& initial_modes() const { return initial_; }
  // Reads to the end and reaps ddprun: its shell-style status, -1 on the
  // deadline (then it is SIGKILLed).
  int finish(std::chrono::milliseconds deadline);

 private:
  bool read_some(std::chrono::steady_clock::time_point until);

  pid_t pid_ = -1;
  int master_ = -1;
  std::string screen_;
  termios initial_{};
};

}  // namespace ddprun::testing
