// ddprun's flags as CLI11 options (the launcher's own; cli.h is the
// interface): every plain flag is bound straight to its agent::Options
// field, which keeps its default and its comment; what needs parsing or
// checking against other flags goes to RawFlags, for cli.cc to interpret.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "agent/options.h"
#include "launcher/command.h"

namespace ddprun::launcher {

// What CLI11 cannot write straight into agent::Options: text that is parsed
// or checked against other flags (interpret), and the program's switches.
// Every other flag is bound to its Options field, whose default it keeps.
struct RawFlags {
  std::string nnodes = "1:1";
  std::string nproc = "1";
  std::string rdzv_conf;
  int master_port = -1;  // -1: not given (Options::master_port stays unset)
  std::string signals = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  std::string no_restart_exit_codes;
  std::string redirects = "0";
  std::string tee = "0";
  std::string stdin_rank = "0";
  std::string local_ranks_filter;
  // --hang-timeout: "auto" or seconds; --on-hang: "", restart, exit, report;
  // --stack-capture: auto, eu-stack, gdb, proc, none.
  std::string hang_timeout = "auto";
  std::string on_hang;
  std::string stack_capture = "auto";
  // Durations in seconds as given; agent::Options holds them as
  // milliseconds (base::millis_from_seconds). -1: --stuck-timeout not given.
  double heartbeat_timeout_s = 0.0;
  double silence_timeout_s = 0.0;
  double hang_timeout_floor_s = 60.0;
  double heartbeat_grace_s = 0.0;
  double stuck_timeout_s = -1.0;
  double straggler_window_s = 60.0;
  double restart_backoff_s = 0.1;
  double progress_interval_s = 10.0;
  double recovery_timeout_s = 300.0;
  double term_timeout_s = 30.0;
  // --monitor-interval: accepted for torchrun compatibility and checked;
  // the agent is event driven and never polls.
  double monitor_interval_s = 0.1;
  // --restart-scope: group or rank.
  std::string restart_scope = "group";
  CommandSpec program;  // -m, --no-python, --run-path
  // torchrun 2.x
  std::string numa_binding;
  std::string event_log_handler = "null";
  std::string logs_specs, dup_stdout, dup_stderr, print_completion;
};

// Defines every flag (both spellings, PET_* fallbacks, help groups) on `app`,
// writing into `o` and `f` when app.parse() runs.
void define_flags(CLI::App& app, agent::Options& o, RawFlags& f);

// CLI11 takes the next argument as the value of `--flag=` with nothing after
// the '=' (so `--log-dir= train.py x` would run x). Before the program, each
// `--flag=` becomes `--flag ""` for an option that takes a value, and is
// dropped for an on/off flag (its default). Scanning stops at the program
// (the first argument that is neither a flag nor a flag's value) or "--".
// Each flag's name goes through expand_prefix first.
std::vector<std::string> split_empty_values(const CLI::App& app, int argc,
                                            const char* const* argv);

// argparse-style prefixes, as torchrun accepts them: `--nproc-per-nod` is
// --nproc-per-node, `--max-r` --max-restarts; a name that is a flag, or no
// flag's prefix, comes back as given. A prefix of two flags throws
// UsageError naming them.
std::string expand_prefix(const CLI::App& app, const std::string& name);

}  // namespace ddprun::launcher
