#include "launcher/command.h"

#include <stdexcept>

namespace ddprun::launcher {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "python", "python3", "python3.11", as a path or a bare name: the worker is
// that interpreter, so ddprun's Python bootstrap applies to it.
bool is_python_interpreter(const std::string& program) {
  const auto slash = program.rfind('/');
  const std::string name = slash == std::string::npos ? program : program.substr(slash + 1);
  if (name.rfind("python", 0) != 0) return false;
  return name.find_first_not_of("0123456789.", 6) == std::string::npos;
}

}  // namespace

Command build_command(const CommandSpec& spec) {
  if (spec.module && spec.no_python)
    throw std::invalid_argument("--module and --no-python cannot be used together");
  if (spec.run_path && spec.module)
    throw std::invalid_argument("--run-path and --module cannot be used together");
  Command cmd;
  if (spec.run_path) {
    // torchrun's --run-path runs the script in the agent's interpreter with
    // runpy; we have no interpreter, so the worker's python does it.
    cmd.argv = {spec.python, "-u", "-c",
                "import runpy, sys; sys.argv = sys.argv[1:]; "
                "runpy.run_path(sys.argv[0], run_name='__main__')",
                spec.program};
    cmd.is_python = true;
  } else if (spec.module) {
    cmd.argv = {spec.python, "-u", "-m", spec.program};
    cmd.is_python = true;
  } else if (!spec.no_python && ends_with(spec.program, ".py")) {
    cmd.argv = {spec.python, "-u", spec.program};
    cmd.is_python = true;
  } else {
    cmd.argv = {spec.program};
    // `ddprun python3 train.py`: run as given, but still a Python worker.
    cmd.is_python = is_python_interpreter(spec.program);
  }
  cmd.argv.insert(cmd.argv.end(), spec.args.begin(), spec.args.end());
  return cmd;
}

}  // namespace ddprun::launcher
