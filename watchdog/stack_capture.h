// Stack capture of a hung worker, called by the agent before teardown.
//
// Python workers started with faulthandler on (PYTHONFAULTHANDLER set in
// their environment, which the agent does unless the user set it, or
// -X faulthandler) dump every thread's traceback to their stderr when sent
// SIGABRT: plan_stack_capture says so and the agent sends the signal as
// part of teardown; the traceback is then in the worker's stderr log and
// extract_python_traceback pulls it out for the report.
// Other workers get `gdb -batch -p PID -ex "thread apply all bt"` when gdb
// is installed, bounded by a deadline (gdb is killed when it passes), else
// the kernel's view of each thread from /proc. The output goes to a file in
// the attempt's log directory.
//
// Blocking: capture_native_stack blocks the caller for at most
// gdb_timeout; the agent calls it once per hung attempt.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

namespace ddprun::watchdog {

enum class StackMethod { kPythonFaulthandler, kGdb, kProc, kNone };
const char* to_string(StackMethod method);

struct StackCaptureOptions {
  // gdb binary; a bare name is searched on PATH. Empty: never use gdb.
  std::string gdb = "gdb";
  // gdb is killed when it has not finished within this time.
  std::chrono::milliseconds gdb_timeout{10000};
  // Let gdb read debug info and unwind tables. Off (--readnever) is ~3x
  // faster but cannot unwind through libc, so the default is on.
  bool debug_info = true;
};

struct StackCapture {
  int global_rank = -1;
  pid_t pid = 0;
  StackMethod method = StackMethod::kNone;
  // File holding the stacks: gdb/proc output, or the worker's stderr log
  // for Python (where faulthandler writes).
  std::string path;
  // The stacks themselves (possibly truncated), for the report.
  std::string text;
  // Why the preferred method was not used, or failed; empty when it worked.
  std::string note;
};

// True when `pid` runs Python with faulthandler enabled (reads
// /proc/PID/environ and cmdline), so SIGABRT will print its tracebacks.
bool python_faulthandler_enabled(pid_t pid);

// Runs gdb (or falls back to /proc) against `pid` and writes the result to
// "<dir>/stack_rank<global_rank>.txt". Never throws.
StackCapture capture_native_stack(pid_t pid, int global_rank, const std::string& dir,
                                  const StackCaptureOptions& options = {});

// Finds faulthandler's dump ("Fatal Python error: Aborted" and the thread
// tracebacks after it) in a worker's log; empty when absent. Reads at most
// the last `max_bytes` of the file.
std::string extract_python_traceback(const std::string& log_path,
                                     std::size_t max_bytes = 256 * 1024);

}  // namespace ddprun::watchdog
