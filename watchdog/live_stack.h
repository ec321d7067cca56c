// A running Python worker's every-thread traceback, printed by the worker
// itself and without stopping it: ddprun's sitecustomize registers
// faulthandler on the signal in DDPRUN_PYSTACK_SIGNAL, appending to
// $DDPRUN_PYSTACK_DIR/pystack_<pid>.txt (introspect/python/sitecustomize.py).
// Used by the watchdog's evidence rule and hang reports (the stacks before
// the verdict, with nothing printed on the console) and by `ddprun stacks`.
//
// Only a process that caught the signal is sent it (SigCgt): a real-time
// signal without a handler would kill it.
//
// Blocking: polls the file for up to `timeout`; call it off the event loop.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace ddprun::watchdog {

struct LiveDump {
  bool ok = false;
  bool instrumented = true;  // false: no ddprun stack signal in its environment
  std::string text;  // what the dump appended
  std::string note;  // why there is none
};

LiveDump dump_python_stack(pid_t pid, std::chrono::milliseconds timeout);

// Whether the worker's main thread runs Python bytecode now, and where. The
// sitecustomize also catches the signal after the stack signal with a
// Python-level handler, which appends "ddprun-probe LINE FUNCTION FILE" (where
// it interrupted the main thread) to the same file. CPython runs such a handler only between
// two bytecodes of the main thread: a loop of bytecode answers at once, a
// long native call or a garbage collection only once it is over.
struct BytecodeProbe {
  bool answered = false;
  std::string file;
  std::string function;
  int line = 0;
  uint64_t bytes = 0;  // what the answer made the worker write
  std::string note;    // why there is no answer
};

BytecodeProbe probe_bytecode(pid_t pid, std::chrono::milliseconds timeout);

}  // namespace ddprun::watchdog
