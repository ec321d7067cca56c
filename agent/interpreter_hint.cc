#include "agent/interpreter_hint.h"

#include <unistd.h>

#include <sstream>

namespace ddprun::agent {

std::string resolve_in_path(const std::string& program, const std::string& path) {
  if (program.find('/') != std::string::npos) return program;
  std::stringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

InterpreterHint::InterpreterHint(const Options& options)
    : is_python_(options.is_python && !options.command.empty()),
      source_(options.python_source) {
  if (!is_python_) return;
  std::string path;
  for (const auto& kv : options.base_env)
    if (kv.rfind("PATH=", 0) == 0) path = kv.substr(5);
  const std::string& program = options.command.front();
  const std::string found = resolve_in_path(program, path);
  interpreter_ = found.empty() || found == program ? program : program + " = " + found;
}

void InterpreterHint::add_worker_env(const AttemptInfo& attempt, int, EnvMap&) {
  if (attempt.restart_count != attempt_) printed_.clear();
  attempt_ = attempt.restart_count;
}

void InterpreterHint::output(int local_rank, Stream stream, std::string_view) {
  if (stream == Stream::kStdout) printed_.insert(local_rank);
}

std::string InterpreterHint::line(const AttemptResult& result) const {
  if (!is_python_ || !result.root || !result.root->status || !result.root->local_rank) return "";
  if (printed_.count(*result.root->local_rank)) return "";
  const std::string from = source_.empty() ? "" : " (" + source_ + ")";
  const std::string how = source_ == "the command line"
                              ? "name another on the command line"
                              : "choose another with PYTHON_EXEC=/path/to/python (or DDPRUN_PYTHON)";
  return "  python: the worker failed before its first output, running " + interpreter_ + from +
         "; if that is the wrong interpreter, " + how + "\n";
}

}  // namespace ddprun::agent
