// RawTerminal: the one owner of a terminal's saved modes while ddprun has
// put it in raw passthrough (agent/stdin_forwarder.h).
//
// enter() saves the terminal's termios once and switches it to raw_modes():
// no line editing and no echo (the worker's readline edits and echoes), bytes
// exactly as typed (no CR/NL mapping), one byte a read; ISIG stays, so
// Ctrl-C, Ctrl-Z and Ctrl-\ still signal ddprun, which forwards them as it
// does in line mode; OPOST stays, so ddprun's own "\n" still ends a line.
// leave() and the destructor put the saved modes back, so every path that
// unwinds (a normal or error exit, an exception) restores the terminal; the
// signal paths (Ctrl-Z before stopping, SIGCONT after) call leave() and
// enter() explicitly. A SIGKILL of ddprun itself leaves the terminal raw,
// as it would any program's (`stty sane` or `reset` repairs it).
//
// Only a process in the terminal's foreground group changes its modes
// (enter() refuses otherwise: from the background it would change the
// shell's terminal, or be stopped by SIGTTOU). Move-only; one thread.
#pragma once

#include <termios.h>

namespace ddprun::base {

class RawTerminal {
 public:
  // `fd`: a terminal (not owned; it must outlive this object).
  explicit RawTerminal(int fd) : fd_(fd) {}
  ~RawTerminal() { leave(); }
  RawTerminal(RawTerminal&& other) noexcept;
  RawTerminal& operator=(RawTerminal&&) = delete;
  RawTerminal(const RawTerminal&) = delete;
  RawTerminal& operator=(const RawTerminal&) = delete;

  // Raw mode on; false when it is not (background, not a terminal, a
  // failed tcsetattr). Idempotent.
  bool enter();
  // The saved modes back (TCSADRAIN: what ddprun wrote first goes out
  // under the modes it was written with). Idempotent.
  void leave();
  bool raw() const { return raw_; }
  // The terminal's own modes: the saved ones while raw; false when they
  // cannot be read.
  bool own_modes(termios& out) const;

  // What enter() sets, from the terminal's `modes`.
  static termios raw_modes(const termios& modes);

 private:
  int fd_;
  bool raw_ = false;
  termios saved_{};
};

}  // namespace ddprun::base
