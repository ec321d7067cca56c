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

namespace {

// The last non-empty line of `text`.
std::string_view last_line(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
    text.remove_suffix(1);
  const size_t nl = text.rfind('\n');
  return nl == std::string_view::npos ? text : text.substr(nl + 1);
}

// What python prints last when it cannot import or compile the program: a
// python3 without torch, or python2 reading python3 (IndentationError and
// TabError are SyntaxErrors too).
bool import_or_syntax_error(std::string_view line) {
  for (std::string_view kind : {"ModuleNotFoundError", "ImportError", "SyntaxError",
                                "IndentationError", "TabError"})
    if (line.substr(0, kind.size()) == kind) return true;
  return false;
}

}  // namespace

void InterpreterHint::add_worker_env(const AttemptInfo& attempt, int, EnvMap&) {
  if (attempt.restart_count != attempt_) {
    printed_.clear();
    stderr_tail_.clear();
  }
  attempt_ = attempt.restart_count;
}

void InterpreterHint::output(int local_rank, Stream stream, std::string_view data) {
  if (stream == Stream::kStdout) {
    printed_.insert(local_rank);
    return;
  }
  std::string& tail = stderr_tail_[local_rank];
  tail.append(data.size() > kTailBytes ? data.substr(data.size() - kTailBytes) : data);
  if (tail.size() > kTailBytes) tail.erase(0, tail.size() - kTailBytes);
}

std::string InterpreterHint::line(const AttemptResult& result) const {
  if (!is_python_ || !result.root || !result.root->status || !result.root->local_rank) return "";
  const int rank = *result.root->local_rank;
  if (printed_.count(rank)) return "";
  const ExitStatus& status = *result.root->status;
  if (status.signaled) return "";
  const auto tail = stderr_tail_.find(rank);
  const bool cannot_run = status.code == 126 || status.code == 127;
  const bool cannot_import =
      status.code == 1 && tail != stderr_tail_.end() && import_or_syntax_error(last_line(tail->second));
  if (!cannot_run && !cannot_import) return "";
  const std::string from = source_.empty() ? "" : " (" + source_ + ")";
  const std::string how = source_ == "the command line"
                              ? "name another on the command line"
                              : "choose another with PYTHON_EXEC=/path/to/python (or DDPRUN_PYTHON)";
  return "  python: the worker failed before its first output, running " + interpreter_ + from +
         "; if that is the wrong interpreter, " + how + "\n";
}

}  // namespace ddprun::agent
