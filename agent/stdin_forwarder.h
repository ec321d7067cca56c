// Forwards what is typed at ddprun's terminal to a worker, so input(), pdb
// and breakpoint() work there. Input follows the rank that waits for it:
// a worker whose terminal readline holds (not in line mode: pdb, input()
// after `import readline`) or that is blocked reading its stdin
// (/proc/<pid>/syscall: read(0, ...)); with none waiting, --stdin-rank's.
// A change of rank is told in one line.
//
// The worker cannot read the terminal itself: it is in a process group of
// its own, and reading would stop it with SIGTTIN (a silent hang). ddprun,
// in the terminal's foreground group, reads instead and writes what it reads
// to the worker's pty or pipe.
//
// Two ways to read, following the worker that gets the input:
// - Raw passthrough, while that worker's input is its pty (ddprun's stdout
//   is a terminal too): ddprun's terminal goes raw (base/terminal_modes.h:
//   no echo, no editing, signals kept) and every key is forwarded as typed.
//   The worker's pty then edits and echoes as a terminal does: its own line
//   discipline for a plain input(), its readline for pdb and input() after
//   `import readline` (history, Tab completion, editing). Raw for the whole
//   time, not only while readline reads: readline echoes only where the
//   terminal echoes when it starts, so the worker's pty must echo, and
//   ddprun's terminal must not echo the same keys again. While the worker
//   waits for input its output passes through as it writes it
//   (Console::write_interactive); otherwise it is prefixed lines.
//   The modes come back when no pty has the input (between attempts,
//   after the last worker's exit or SIGKILL), before ddprun stops (Ctrl-Z;
//   raw again after SIGCONT, in the foreground only), and when ddprun exits
//   by any path that unwinds.
// - Line mode otherwise (a pipe, or ddprun in the background): the terminal
//   echoes and edits, each finished line is forwarded; Ctrl-D reaches the
//   worker as end of input.
// Whether a worker waits is looked at when its terminal shows output
// (readline sets the mode, then writes the prompt), when a key is typed,
// and when a worker comes or goes: no polling.
//
// Switching: when several ranks wait, one line names the rank that gets the
// input and the keys that move it: Ctrl-] then a rank's digit (0-9), or
// Ctrl-] n for the next waiting rank. Ctrl-] twice sends one Ctrl-] (it is
// readline's character-search). In line mode the keys take a line of their
// own (Ctrl-] 1 Enter).
//
// While ddprun runs in the background the terminal answers EIO (SIGTTIN is
// ignored); reading resumes on SIGCONT. It reads from its own file
// description of the terminal, so the non-blocking mode Asio needs never
// leaks into the shell's. Input typed while no worker is there (between
// restarts) is dropped. Loop thread only.
#pragma once

#include <sys/types.h>

#include <array>
#include <functional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>

#include "agent/worker_streams.h"
#include "base/terminal_modes.h"

namespace ddprun::agent {

class StdinForwarder {
 public:
  // The switch key (Ctrl-]).
  static constexpr char kSwitchKey = '\x1d';

  // `terminal_fd`: ddprun's stdin, a terminal. Throws std::system_error
  // when it cannot be reopened.
  // `on_line` runs for each line typed in line mode (its echo moved the cursor).
  StdinForwarder(boost::asio::io_context& io, int terminal_fd, std::function<void()> on_line);
  ~StdinForwarder();

  void start();
  // A worker's input end (WorkerStreams::input), rank `rank`, process `pid`.
  // `preferred`: the --stdin-rank worker, which gets input when no other
  // waits for it; replaces any previous target of that rank.
  // `set_interactive` (may be empty) turns the raw passthrough of the
  // worker's output on and off (OutputPump::set_interactive).
  void add_target(int rank, pid_t pid, base::ScopedFd fd, bool is_pty, bool preferred,
                  std::function<void(bool)> set_interactive = {});
  // The worker exited: it gets no more input.
  void remove_target(pid_t pid);
  // The attempt ended: input goes nowhere until the next add_target.
  void clear_target();
  // The worker's terminal showed output: its mode may have changed.
  void output_from(pid_t pid);
  // Before ddprun stops (Ctrl-Z): the terminal's own modes back.
  void before_stop();
  // After SIGCONT: read again if the background stopped us, raw again if a
  // worker's readline still waits.
  void resume();
  // The terminal is raw now.
  bool raw() const { return raw_.raw(); }
  // ddprun's terminal's own modes (not the raw ones): a worker's pty gets
  // its control characters and input flags.
  bool terminal_modes(termios& out) const { return raw_.own_modes(out); }

 private:
  struct Target {
    int rank;
    pid_t pid;
    base::ScopedFd fd;
    bool is_pty;
    bool preferred;
    std::function<void(bool)> set_interactive;
    bool readline = false;  // its pty is out of line mode (last looked at)
    bool reading = false;   // blocked in read(0) (last looked at)
    bool waits() const { return readline || reading; }
  };
  void read_more();
  void handle_input(const char* data, size_t size);
  // Looks at every worker again (`all`) or uses what is known, picks the
  // target and puts the terminal and the target's output in the mode it
  // needs.
  Target* update(bool all);
  // Where typed input goes now: the rank chosen with the switch key while it
  // waits, else a waiting one (the preferred first), else the preferred
  // one, else the first still there (nullptr: none).
  Target* pick();
  void announce(Target* chosen);
  void switch_to(char key);
  void set_passthrough(Target* t);
  void forward(Target* t, const char* data, size_t size);
  Target* find_rank(int rank);

  boost::asio::posix::stream_descriptor in_;
  base::RawTerminal raw_;
  std::function<void()> on_line_;
  std::vector<Target> targets_;
  int last_rank_ = -1;       // the rank the last input went to
  int last_told_ = -1;       // the rank last told as the one that gets input
  std::string last_waiting_;  // the waiting ranks last told ("0,1")
  int chosen_rank_ = -1;     // picked with the switch key
  pid_t passthrough_pid_ = -1;  // the worker whose output is passed through
  bool switch_pending_ = false;  // Ctrl-] read, its key not yet
  bool skip_newline_ = false;    // line mode: the Enter after a switch key
  bool stopped_ = false;         // between before_stop() and resume()
  bool tell_ = false;            // the next pick is told even if unchanged
  bool reading_ = false;
  bool warned_ = false;
  std::array<char, 4096> buf_;
};

}  // namespace ddprun::agent
