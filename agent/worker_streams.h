// The standard streams one worker gets, and the ends the agent keeps.
//
// When ddprun's stdout is a terminal, the worker's stdout and stderr are
// each a pseudo-terminal of their own, so isatty(), colours, tqdm and the
// terminal width behave as under torchrun while the agent still prefixes
// and logs every line. The pty is not the worker's controlling terminal (it
// stays in its own process group of ddprun's session): reading it never
// stops the worker with SIGTTIN, and Ctrl-C/Ctrl-Z reach ddprun first.
// Output processing is off (a "\n" stays "\n" for the splitter; the real
// terminal adds its "\r"), and so is echo, except on the pty that typed
// input reaches: ddprun's terminal is raw while a worker's pty has the
// input, so that pty edits and echoes as a terminal does (and readline
// echoes only where the terminal does). Otherwise: pipes.
//
// Standard input goes to one rank (--stdin-rank): ddprun's own stdin when
// it is not a terminal; typed input forwarded by the agent when it is
// (stdin_forwarder.h), through the stdout pty or a pipe. Other ranks read
// /dev/null.
#pragma once

#include <sys/ioctl.h>

#include <termios.h>

#include <optional>
#include <string>

#include "base/scoped_fd.h"

namespace ddprun::agent {

enum class StdinMode {
  kNull,     // /dev/null
  kInherit,  // ddprun's own stdin (not a terminal)
  kForward,  // typed at ddprun's terminal, forwarded by the agent
};

struct StreamPlan {
  bool pty = false;  // stdout and stderr as pseudo-terminals
  winsize size{};    // their window size
  StdinMode stdin_mode = StdinMode::kNull;
  // kForward on a pty: ddprun's terminal's own modes. The worker's pty
  // takes their input flags, control characters and echo, so it edits
  // and echoes as that terminal does (raw passthrough, stdin_forwarder.h).
  std::optional<termios> terminal;
};

struct WorkerStreams {
  base::ScopedFd out_read, out_write;  // pty master / slave, or pipe ends
  base::ScopedFd err_read, err_write;
  base::ScopedFd in_child;  // the child's fd 0; -1 with kInherit
  base::ScopedFd input;     // kForward: where the agent writes typed input (non-blocking)
  bool input_is_pty = false;  // `input` is a pty master: EOF is VEOF, not close
};

// Throws SpawnError naming the call that failed.
WorkerStreams open_worker_streams(const StreamPlan& plan);

// The console's window size less `prefix_width` columns (the prefix takes
// them on every line); false when `fd` is not a terminal.
bool console_window(int fd, size_t prefix_width, winsize& size);

}  // namespace ddprun::agent
