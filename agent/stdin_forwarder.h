// Forwards what is typed at ddprun's terminal to a worker, so input(), pdb
// and breakpoint() work there. Input follows the rank that waits for it:
// each typed line goes to a worker whose terminal readline holds (not in
// line mode: pdb, input() after `import readline`) or that is blocked
// reading its stdin (/proc/<pid>/syscall: read(0, ...)); with none waiting,
// to --stdin-rank's. A change of rank is told in one line.
//
// The worker cannot read the terminal itself: it is in a process group of
// its own, and reading would stop it with SIGTTIN (a silent hang). ddprun,
// in the terminal's foreground group, reads instead (the terminal stays in
// its normal line mode: the shell's echo, editing and Ctrl-C/Ctrl-Z work as
// ever) and writes each line to the worker's pty or pipe. Ctrl-D reaches
// the worker as end of input. While ddprun runs in the background the
// terminal answers EIO (SIGTTIN is ignored); reading resumes on SIGCONT.
//
// It reads from its own file description of the terminal, so the
// non-blocking mode Asio needs never leaks into the shell's. Input typed
// while no worker is there (between restarts) is dropped. Loop thread only.
#pragma once

#include <sys/types.h>

#include <array>
#include <functional>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>

#include "agent/worker_streams.h"

namespace ddprun::agent {

class StdinForwarder {
 public:
  // `terminal_fd`: ddprun's stdin, a terminal. Throws std::system_error
  // when it cannot be reopened.
  // `on_line` runs for each typed line (its echo moved the cursor).
  StdinForwarder(boost::asio::io_context& io, int terminal_fd, std::function<void()> on_line);
  ~StdinForwarder();

  void start();
  // A worker's input end (WorkerStreams::input), rank `rank`, process `pid`.
  // `preferred`: the --stdin-rank worker, which gets input when no other
  // waits for it; replaces any previous target of that rank.
  void add_target(int rank, pid_t pid, base::ScopedFd fd, bool is_pty, bool preferred);
  // The worker exited: it gets no more input.
  void remove_target(pid_t pid);
  // The attempt ended: input goes nowhere until the next add_target.
  void clear_target() { targets_.clear(); }
  // After SIGCONT: read again if the background stopped us.
  void resume();

 private:
  struct Target {
    int rank;
    pid_t pid;
    base::ScopedFd fd;
    bool is_pty;
    bool preferred;
  };
  void read_more();
  // Where typed input goes now: a worker waiting for it, else the
  // preferred one, else the first still there (nullptr: none).
  Target* pick();
  void forward(Target* t, const char* data, size_t size);

  boost::asio::posix::stream_descriptor in_;
  std::function<void()> on_line_;
  std::vector<Target> targets_;
  int last_rank_ = -1;  // the rank the last input went to (told on a change)
  bool reading_ = false;
  bool warned_ = false;
  std::array<char, 4096> buf_;
};

}  // namespace ddprun::agent
