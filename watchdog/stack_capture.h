// Stack capture of a hung worker, called by the agent before teardown.
//
// Python workers started with faulthandler on (PYTHONFAULTHANDLER set in
// their environment, which the agent does unless the user set it, or
// -X faulthandler) dump every thread's traceback to their stderr when sent
// SIGABRT: plan_stack_capture says so and the agent sends the signal as
// part of teardown; the traceback is then in the worker's stderr log and
// extract_python_traceback pulls it out for the report.
// Other workers get the first of these that works, each bounded by a
// deadline (the tool is killed when it passes):
//   1. `eu-stack -p PID` (elfutils): every thread's symbolized frames in
//      milliseconds. It comes first because the capture sits between
//      detection and the restart, and gdb takes up to seconds on a
//      process with LibTorch loaded.
//   2. `gdb -batch -p PID -ex "thread apply all bt"`: slower, but present
//      where elfutils is not, and reads separate debug info more widely.
//   3. the kernel's view of each thread from /proc (always works).
// A tool that is missing, refused (ptrace) or printed no frame is skipped;
// the reason goes into StackCapture::note. The output goes to a file in
// the attempt's log directory.
// Python frames without instrumentation (a worker whose bootstrap did not
// run, `python -I`, a job ddprun did not start): capture_python_stack reads
// the interpreter's frames from outside (each tool looked for beside
// ddprun's own executable first, then on PATH) with the first of
//   1. `py-spy dump --pid PID` (PyPI py-spy): pauses the process only
//      while it copies the frames (docs/introspect.md has the figures);
//   2. `pystack remote PID` (PyPI pystack, Bloomberg's);
// each bounded by tool_timeout like the native tools. Neither installed:
// the note says so with the install command.
//
// Blocking: capture_native_stack blocks the caller for at most
// 2 x tool_timeout (one per tool), so the agent runs it on a thread of its
// own (agent_hook.h); CaptureCancel ends it early from another thread. The
// tools are clone children (no SIGCHLD), reaped by the capturing thread
// only, never by the agent's reaper.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <string>

#include "base/mutex.h"

namespace ddprun::watchdog {

enum class StackMethod { kPythonFaulthandler, kPySpy, kPyStack, kEuStack, kGdb, kProc, kNone };
const char* to_string(StackMethod method);

struct StackCaptureOptions {
  // eu-stack binary (Debian's elfutils), tried first; a bare name is
  // searched on PATH. Empty: never use eu-stack.
  std::string eu_stack = "eu-stack";
  // Also print source file:line and inlined frames (eu-stack -s -i). Off:
  // reading the line tables makes each capture several times slower, all
  // of it before the restart; function names and addresses are printed
  // anyway.
  bool source_lines = false;
  // gdb binary, tried when eu-stack is absent or fails; a bare name is
  // searched on PATH. Empty: never use gdb.
  std::string gdb = "gdb";
  // py-spy and pystack binaries for Python frames read from outside
  // (capture_python_stack); a bare name is searched in python_tools_dir,
  // then on PATH. Empty: never.
  std::string py_spy = "py-spy";
  std::string pystack = "pystack";  // the tool: not-a-contract-name (kFilePyStackDir)
  // Searched before PATH for py-spy and pystack. Empty: the folder of this
  // program's own executable (/proc/self/exe): pip installs py-spy, a
  // dependency of the wheel, beside ddprun in the venv's bin/, which is not
  // on PATH when a user runs /path/venv/bin/ddprun without activating it.
  std::string python_tools_dir;
  // Each tool is killed when it has not finished within this time.
  std::chrono::milliseconds tool_timeout{10000};
  // Let gdb read debug info and unwind tables. Off (--readnever) is faster
  // but cannot unwind through libc, so the default is on.
  bool debug_info = true;
};

struct StackCapture {
  int global_rank = -1;
  pid_t pid = 0;
  StackMethod method = StackMethod::kNone;
  // File holding the stacks: eu-stack/gdb/proc output, or the worker's stderr log
  // for Python (where faulthandler writes).
  std::string path;
  // The stacks themselves (possibly truncated), for the report.
  std::string text;
  // Why the preferred method was not used, or failed; empty when it worked.
  std::string note;
};

// Stops a capture running on another thread: the tool it runs is killed
// and no further tool is tried. Thread-safe.
class CaptureCancel {
 public:
  void cancel();
  bool cancelled() const { return cancelled_; }
  // For the capturing thread: the tool's process group is running (false
  // when already cancelled) / is about to be reaped.
  bool start(pid_t pgid);
  void finish();

 private:
  base::Mutex mu_;
  // Atomic for cancelled(), and set under mu_ so that start() either sees
  // it or leaves running_ for cancel() to kill.
  std::atomic<bool> cancelled_{false};
  pid_t running_ GUARDED_BY(mu_) = 0;
};

// True when `pid` runs Python with faulthandler enabled (reads
// /proc/PID/environ and cmdline), so SIGABRT will print its tracebacks.
// PYTHONFAULTHANDLER does not count for an interpreter started with -I or
// -E, which ignores PYTHON* variables (SIGABRT would kill it silently).
bool python_faulthandler_enabled(pid_t pid);

// True when `pid` runs a Python interpreter: a python* executable, or a
// program with libpython mapped (a C++ binary embedding Python).
bool runs_python(pid_t pid);

// What to install for Python stacks when neither tool is found.
inline constexpr const char* kPythonStackInstall = "pip install py-spy";

// Python frames of every thread of `pid` through py-spy, else pystack,
// written to "<dir>/stack_rank<global_rank>_python.txt". Never throws;
// method kNone with a note (the install command when neither tool exists)
// when no tool printed a traceback.
StackCapture capture_python_stack(pid_t pid, int global_rank, const std::string& dir,
                                  const StackCaptureOptions& options = {},
                                  CaptureCancel* cancel = nullptr);

// Runs eu-stack, else gdb, else reads /proc for `pid` and writes the result
// to "<dir>/stack_rank<global_rank>.txt". Never throws. Once `cancel` is
// cancelled, the tool running is killed and /proc's view is what is left.
StackCapture capture_native_stack(pid_t pid, int global_rank, const std::string& dir,
                                  const StackCaptureOptions& options = {},
                                  CaptureCancel* cancel = nullptr);

// Finds faulthandler's dump ("Fatal Python error: Aborted" and the thread
// tracebacks after it) in a worker's log; empty when absent. Reads at most
// the last `max_bytes` of the file.
std::string extract_python_traceback(const std::string& log_path,
                                     std::size_t max_bytes = 256 * 1024);

}  // namespace ddprun::watchdog
