// A Python worker that dies before it printed anything usually ran the wrong
// interpreter (`ModuleNotFoundError: No module named 'torch'` from a python3
// without torch). InterpreterHint watches for that and gives the failure
// summary one line naming the interpreter the worker ran and how to choose
// another -- only on that evidence: no output on stdout, and either exit
// status 126/127 (the interpreter could not run) or exit status 1 with an
// ImportError, ModuleNotFoundError or SyntaxError as the last line of its
// stderr. A signal (SIGSEGV, SIGKILL), another exit status (sys.exit(3)) or
// another exception (a failure after init_process_group) gets no hint.
//
// Thread safety: the agent's event-loop thread only, like every hook.
#pragma once

#include <map>
#include <set>
#include <string>

#include "agent/hooks.h"
#include "agent/options.h"

namespace ddprun::agent {

class InterpreterHint : public AgentHooks {
 public:
  // Reads the command, where its interpreter came from, and the workers'
  // PATH (to name the file a bare "python3" resolved to).
  explicit InterpreterHint(const Options& options);

  void add_worker_env(const AttemptInfo& attempt, int local_rank, EnvMap& env) override;
  void output(int local_rank, Stream stream, std::string_view data) override;

  // "" unless the root cause of `result` is a Python worker that failed
  // before its first output on stdout, as a wrong interpreter does (above);
  // else one line ending in '\n'.
  std::string line(const AttemptResult& result) const;

 private:
  bool is_python_;
  std::string interpreter_;  // as run, resolved through PATH
  std::string source_;       // "$PYTHON_EXEC", ...
  int attempt_ = -1;
  std::set<int> printed_;    // local ranks that wrote to stdout this attempt
  std::map<int, std::string> stderr_tail_;  // each rank's last kTailBytes of stderr
  static constexpr size_t kTailBytes = 512;
};

// `program` as exec would find it: itself when it has a '/', else the first
// executable file of that name in the ':'-separated `path`; "" when none.
std::string resolve_in_path(const std::string& program, const std::string& path);

}  // namespace ddprun::agent
