// ddprun's command line: every torchrun flag in both spellings
// (--nproc-per-node and --nproc_per_node) with torchrun's defaults and PET_*
// environment fallbacks, plus ddprun's own flags, parsed into one
// agent::Options. The launcher is the only code that reads argv or the
// launcher's environment; tests call parse_command_line without processes.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "agent/options.h"

namespace ddprun::launcher {

// A wrong or conflicting flag; what() is one line naming the flag.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ParseResult {
  // True for --help and --version: print `help_text` and exit 0.
  bool help = false;
  std::string help_text;
  agent::Options options;
  // Lines for the log: settings taken from the environment (Slurm).
  std::vector<std::string> notes;
};

// The launcher's environment as seen by the parser (PET_* fallbacks,
// DDPRUN_PYTHON, CUDA_VISIBLE_DEVICES) comes from getenv; base_env for the
// workers from `environ`. Throws UsageError.
ParseResult parse_command_line(int argc, const char* const* argv);

// Exit status for usage errors.
inline constexpr int kUsageExit = 2;

}  // namespace ddprun::launcher
