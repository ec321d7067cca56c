// Turning "ddprun [flags] program args..." into the worker's argv.
//
// A program ending in ".py" runs as `<python> -u program args...` without
// the user saying so (torchrun always prepends python); -m/--module runs
// `<python> -u -m module args...`; --no-python, or any other program, runs
// it directly; --run-path runs the script with runpy.run_path in <python>.
// A program named like an interpreter (python, python3, /usr/bin/python3.11)
// runs as given and is a Python worker too (is_python: ddprun's bootstrap on
// its PYTHONPATH, automatic beats).
// A program file that exec cannot run (no execute bit, or neither "#!" nor
// ELF: execve's "Exec format error"), or a bare name found in the current
// folder but not in PATH, runs with python too, as torchrun runs every
// program with sys.executable: `ddprun train` and `ddprun ./train` for a
// Python script without the suffix (python_file below).
#pragma once

#include <string>
#include <vector>

namespace ddprun::launcher {

struct CommandSpec {
  std::string program;             // the first non-flag argument
  std::vector<std::string> args;   // everything after it, untouched
  bool module = false;             // -m/--module
  bool no_python = false;          // --no-python
  bool run_path = false;           // --run-path
  bool python_file = false;        // program is a Python file exec cannot run (runs_with_python)
  std::string python = "python3";  // $PYTHON_EXEC, else $DDPRUN_PYTHON, else python3 from PATH
};

struct Command {
  std::vector<std::string> argv;
  bool is_python = false;
};

// True when `program` (not ending in .py) should run as `<python> -u program`:
// a regular file exec would refuse (not executable, or not "#!"/ELF), or a
// bare name not found in the ':'-separated `path` but present in the
// current folder (where python, not exec, would find it).
bool runs_with_python(const std::string& program, const std::string& path);

// Throws std::invalid_argument naming the conflicting flags.
Command build_command(const CommandSpec& spec);

}  // namespace ddprun::launcher
