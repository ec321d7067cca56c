#include "launcher/command.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <stdexcept>

#include "agent/interpreter_hint.h"
#include "base/scoped_fd.h"

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

// execve would run it: executable by us and starting with "#!" or ELF's
// magic; else execve fails with EACCES or ENOEXEC ("Exec format error").
bool exec_can_run(const std::string& file) {
  if (::access(file.c_str(), X_OK) != 0) return false;
  const base::ScopedFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd) return true;  // let exec report what is wrong
  char head[4] = {0};
  const ssize_t n = ::read(fd.get(), head, sizeof head);
  if (n >= 2 && head[0] == '#' && head[1] == '!') return true;
  return n == 4 && head[0] == 0x7f && head[1] == 'E' && head[2] == 'L' && head[3] == 'F';
}

bool is_regular_file(const std::string& file) {
  struct stat st{};
  return ::stat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

bool runs_with_python(const std::string& program, const std::string& path) {
  if (program.empty() || ends_with(program, ".py") || is_python_interpreter(program)) return false;
  if (program.find('/') != std::string::npos)
    return is_regular_file(program) && !exec_can_run(program);
  // torchrun runs `python -u name`: python opens ./name, exec searches PATH.
  return agent::resolve_in_path(program, path).empty() && is_regular_file(program);
}

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
  } else if (!spec.no_python && (ends_with(spec.program, ".py") || spec.python_file)) {
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
