// What a Python traceback dump says about a rank's main thread: where it
// is, whether it waits inside a collective (and which), whether it waits on
// its own child processes. Reads faulthandler's layout ("Current thread
// 0x... (most recent call first):" / '  File "x.py", line 3 in f') and
// py-spy's ('Thread 12 (idle): "MainThread"' / "    f (x.py:3)").
//
// The main thread is the one whose outermost frame is a module's top level
// (py-spy names it MainThread): the training loop runs there, while the
// other threads (a DataLoader's pin thread, a progress bar's) come and go.
#pragma once

#include <string>
#include <vector>

namespace ddprun::watchdog {

struct PythonFrame {
  std::string file;
  int line = 0;
  std::string function;
};

struct PythonWhere {
  bool found = false;               // a main thread with frames was found
  std::vector<PythonFrame> frames;  // the main thread's, innermost first
  // The collective it waits in: a torch.distributed call ("all_reduce",
  // "barrier", ...), "broadcast (DDP's buffers)" in DDP's forward, or
  // "backward (DDP's gradient all-reduce)"; empty outside any.
  std::string collective;
  bool in_backward = false;
  // Blocked on its own children: a DataLoader's workers, a subprocess.
  bool waits_on_children = false;
  // Blocked reading a socket (an HTTP call to a tracking server, a
  // download): a server outside the job may answer yet.
  bool waits_on_network = false;
  // The innermost frame in the program's own code ("train.py:42 in step"),
  // else the innermost frame.
  std::string call_site;
};

PythonWhere parse_python_stack(const std::string& dump);

// "  File ..., line N in f" lines of the innermost `max` frames, for people.
std::string frames_text(const PythonWhere& where, std::size_t max);

}  // namespace ddprun::watchdog
