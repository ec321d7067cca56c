// Forwards what is typed at ddprun's terminal to the one worker that reads
// standard input (--stdin-rank), so input(), pdb and breakpoint() work there.
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

#include <array>
#include <functional>

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
  // The stdin rank's end (WorkerStreams::input); replaces any previous one.
  void set_target(base::ScopedFd fd, bool is_pty);
  // The attempt ended: input goes nowhere until the next set_target.
  void clear_target() { target_.reset(); }
  // After SIGCONT: read again if the background stopped us.
  void resume();

 private:
  void read_more();
  void forward(const char* data, size_t size);

  boost::asio::posix::stream_descriptor in_;
  std::function<void()> on_line_;
  base::ScopedFd target_;
  bool target_is_pty_ = false;
  bool reading_ = false;
  bool warned_ = false;
  std::array<char, 4096> buf_;
};

}  // namespace ddprun::agent
