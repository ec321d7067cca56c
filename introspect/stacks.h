// Stacks of running processes without stopping them, for `ddprun stacks`
// (through the agent) and `ddprun attach`.
//
// Python: workers started by ddprun import ddprun's sitecustomize
// (introspect/python/sitecustomize.py), which, when DDPRUN_PYSTACK_SIGNAL
// and DDPRUN_PYSTACK_DIR are in its environment, registers faulthandler on
// that signal with all_threads=True, appending to
// $DDPRUN_PYSTACK_DIR/pystack_<pid>.txt. collect_stacks reads both variables
// from the process's /proc/PID/environ, checks that the handler is really
// installed (SigCgt: a real-time signal without a handler would kill the
// process), sends the signal and reads what the dump appended.
// The signal is SIGRTMIN+6 (40 on glibc): not SIGUSR1/SIGUSR2, which Slurm
// (--signal) and submitit use for preemption and timeouts, and not one
// whose default action a misdirected send could turn into a crash, since
// only a process that caught it is ever sent it.
// Without that instrumentation (a torchrun job, `python -I`, a program
// embedding Python), the Python frames are read from outside by py-spy,
// else pystack (watchdog/stack_capture.h, capture_python_stack); where
// neither is installed, python_note says so with the install command.
// Native: watchdog/stack_capture.h (eu-stack, else gdb, else /proc), which
// stops each thread only for the few milliseconds of the unwinding.
//
// Blocking: up to python_timeout + 2 x tool_timeout per process; callers on
// an event loop run it on another thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "watchdog/stack_capture.h"

namespace ddprun::introspect {

// The signal ddprun's sitecustomize registers faulthandler on.
int pystack_signal();

// The folder holding sitecustomize.py, for workers' PYTHONPATH: the installed
// copy (<prefix>/share/ddprun/introspect) when present, else the source tree's.
std::string python_dir();

struct StackTarget {
  int rank = -1;
  pid_t pid = 0;
};

struct ProcessStacks {
  int rank = -1;
  pid_t pid = 0;
  std::string python;         // every thread's Python frames; "" when none
  std::string python_method;  // python_faulthandler, py-spy, pystack; "" when none
  std::string python_note;    // why there is none, or why the first method failed
  std::string native;
  std::string native_method;  // eu-stack, gdb, proc, none
  std::string native_note;
};

struct CollectOptions {
  // Folder for the native tools' output files.
  std::string dir;
  watchdog::StackCaptureOptions native;
  bool want_native = true;
  // Set from another thread to stop the native capture early; may be null.
  watchdog::CaptureCancel* cancel = nullptr;
  // How long to wait for faulthandler's dump to appear.
  std::chrono::milliseconds python_timeout{3000};
};

std::vector<ProcessStacks> collect_stacks(const std::vector<StackTarget>& targets,
                                          const CollectOptions& options);

nlohmann::json to_json(const ProcessStacks& s);
ProcessStacks stacks_from_json(const nlohmann::json& j);
// "=== rank R (pid P) ===" and both stacks, for people.
std::string to_text(const ProcessStacks& s, const std::string& host = "");

}  // namespace ddprun::introspect
