#include "launcher/flags.h"

#include <sstream>
#include <type_traits>

#include "base/contract.h"
#include "launcher/cli.h"

namespace ddprun::launcher {
namespace {

template <typename T>
std::string default_text(const T& value) {
  if constexpr (std::is_same_v<T, std::string>) {
    return value;
  } else {
    std::ostringstream s;
    s << value;
    return s.str();
  }
}

// Adds the flags of one --help group. opt(): an option with a value, whose
// empty value (--log-dir=, --log-dir "") stands for the flag's default, as
// an empty PET_ variable does (`--log-dir=$UNSET` is common in scripts);
// flag(): a switch. Each may also be set from its PET_ variable.
class FlagGroup {
 public:
  FlagGroup(CLI::App& app, const char* name) : app_(app), name_(name) {}
  const char* name() const { return name_; }

  template <typename T>
  CLI::Option* opt(const char* names, T& var, const char* env, const char* help) {
    auto* option = app_.add_option(names, var, help)->group(name_);
    if (env) option->envname(env);
    // Runs before CLI11 converts the text to the field's type. The default
    // is kept as a value and made text only when an empty value comes: an
    // ostringstream for each of ~40 options was on every launch's path.
    option->transform(
        [def = var](std::string value) { return value.empty() ? default_text(def) : value; }, "",
        "empty_means_default");
    return option;
  }
  CLI::Option* flag(const char* names, bool& var, const char* env, const char* help) {
    auto* option = app_.add_flag(names, var, help)->group(name_);
    if (env) option->envname(env);
    return option;
  }

 private:
  CLI::App& app_;
  const char* name_;
};

void worker_flags(CLI::App& app, agent::Options& o, RawFlags& f) {
  FlagGroup g(app, "Workers");
  // Not opt(): an empty value is refused (interpret_nodes), as torchrun
  // does; `--nproc-per-node=$UNSET` silently running 1 worker hides a bug.
  app.add_option("--nproc-per-node,--nproc_per_node", f.nproc,
                 "Workers on this node: an integer, auto (GPUs, else CPUs), cpu or gpu [1]")
      ->group(g.name())
      ->envname("PET_NPROC_PER_NODE");
  g.opt("--nnodes", f.nnodes, "PET_NNODES", "Nodes, N or MIN:MAX [1:1]");
  g.opt("--node-rank,--node_rank", o.node_rank, "PET_NODE_RANK",
        "This node's rank with the static backend [0]");
  g.opt("--role", o.role, "PET_ROLE", "Role name: ROLE_NAME and the line prefix [default]");
}

void rendezvous_flags(CLI::App& app, agent::Options& o, RawFlags& f) {
  FlagGroup g(app, "Rendezvous");
  g.flag("--standalone", o.standalone, "PET_STANDALONE",
         "Single-node job with a private rendezvous and a free MASTER_PORT");
  g.opt("--rdzv-backend,--rdzv_backend", o.rdzv_backend, "PET_RDZV_BACKEND",
        "Rendezvous backend [static]");
  g.opt("--rdzv-endpoint,--rdzv_endpoint", o.rdzv_endpoint, "PET_RDZV_ENDPOINT",
        "Multi-node: <host>:<port> of the store; the agent on <host> hosts it [port 29400]");
  g.opt("--rdzv-id,--rdzv_id", o.run_id, "PET_RDZV_ID",
        "Job id shared by all nodes: TORCHELASTIC_RUN_ID and the log folder [none]");
  g.opt("--rdzv-conf,--rdzv_conf", f.rdzv_conf, "PET_RDZV_CONF",
        "Extra rendezvous settings, <key>=<value>,...: join_timeout, last_call_timeout, "
        "close_timeout, keep_alive_interval (seconds), keep_alive_max_attempt, is_host, "
        "token (else $DDPRUN_RDZV_TOKEN; never logged); torch's store_type=tcp, "
        "heartbeat_timeout, cas_backoff_max_seconds, read_timeout accepted");
  g.opt("--master-addr,--master_addr", o.master_addr, "PET_MASTER_ADDR",
        "MASTER_ADDR: address of rank 0's node [127.0.0.1]");
  g.opt("--master-port,--master_port", f.master_port, "PET_MASTER_PORT",
        "MASTER_PORT; unset: a free port reserved for the whole job");
  g.opt("--local-addr,--local_addr", o.local_addr, "PET_LOCAL_ADDR",
        "This node's address as other nodes should reach it");
}

void program_flags(CLI::App& app, agent::Options& o, RawFlags& f) {
  FlagGroup g(app, "Program");
  g.flag("-m,--module", f.program.module, "PET_MODULE",
         "Run the program as a Python module (python -m)");
  g.flag("--no-python,--no_python", f.program.no_python, "PET_NO_PYTHON",
         "Execute the program directly, even if it ends in .py");
  g.flag("--run-path,--run_path", f.program.run_path, "PET_RUN_PATH",
         "Run the script with runpy.run_path in the worker's python");
  g.opt("--start-method,--start_method", o.start_method, "PET_START_METHOD",
        "Accepted for torchrun compatibility; workers are always fork+exec'd [spawn]")
      ->check(CLI::IsMember({"spawn", "fork", "forkserver"}));
}

void restart_flags(CLI::App& app, agent::Options& o, RawFlags& f) {
  FlagGroup g(app, "Restarts and teardown");
  g.opt("--max-restarts,--max_restarts", o.max_restarts, "PET_MAX_RESTARTS",
        "Group restarts after a failure before giving up [0]");
  g.opt("--restart-scope,--restart_scope", f.restart_scope, "PET_RESTART_SCOPE",
        "What a failed or hung rank restarts: group (every rank, from the checkpoint) or rank "
        "(only that one, and on several nodes only its node replaces it; the others keep their "
        "state and re-form with it, docs/RECOVERY.md) [group]")
      ->check(CLI::IsMember({"group", "rank"}));
  g.opt("--recovery-timeout,--recovery_timeout", f.recovery_timeout_s, "PET_RECOVERY_TIMEOUT",
        "With --restart-scope=rank: seconds for every rank to join the new generation after a "
        "failure, else a group restart [300]");
  g.opt("--standby-workers,--standby_workers", o.standby_workers, "PET_STANDBY_WORKERS",
        "With --restart-scope=rank: extra workers started with the group that initialise and "
        "wait without a rank; a failed rank's slot goes to one of them instead of a process "
        "started then (recovery in milliseconds; Python scripts: ddprun_recovery.wait_assigned) [0]");
  g.opt("--monitor-interval,--monitor_interval", f.monitor_interval_s, "PET_MONITOR_INTERVAL",
        "Accepted for torchrun compatibility; exits are seen at once, nothing polls");
  g.opt("--term-timeout,--term_timeout,--shutdown-timeout,--shutdown_timeout", f.term_timeout_s,
        "PET_TERM_TIMEOUT", "Seconds between the stop signal and SIGKILL [30]");
  g.opt("--signals-to-handle,--signals_to_handle", f.signals, "PET_SIGNALS_TO_HANDLE",
        "Signals forwarded to the workers before ddprun exits 128+N [SIGTERM,SIGINT,SIGHUP,SIGQUIT]");
  g.opt("--restart-backoff,--restart_backoff", f.restart_backoff_s, "PET_RESTART_BACKOFF",
        "Seconds before the second restart (the first is immediate), doubling per restart up to 30 [0.1]");
  g.opt("--max-no-progress-restarts,--max_no_progress_restarts", o.max_no_progress_restarts,
        "PET_MAX_NO_PROGRESS_RESTARTS",
        "Stop after N attempts in a row whose highest heartbeat step did not advance; 0 off [0]");
  g.opt("--no-restart-exit-codes,--no_restart_exit_codes", f.no_restart_exit_codes,
        "PET_NO_RESTART_EXIT_CODES",
        "Worker exit codes that end the job without a restart, e.g. 2,64 [none]");
}

void hang_flags(CLI::App& app, agent::Options& o, RawFlags& f) {
  FlagGroup g(app, "Hang detection");
  g.opt("--hang-timeout,--hang_timeout", f.hang_timeout, "PET_HANG_TIMEOUT",
        "Freeze detection: auto learns each timeout from the job's own steps and sections "
        "(max(floor, 5 x the longest seen)); S: one fixed timeout in seconds; 0 off [auto]");
  g.opt("--hang-timeout-floor,--hang_timeout_floor", f.hang_timeout_floor_s,
        "PET_HANG_TIMEOUT_FLOOR",
        "Seconds no learned timeout goes below: longer than a GC pause, a data loader's epoch "
        "restart or a page-cache stall of a healthy job [60]");
  g.opt("--on-hang,--on_hang", f.on_hang, "PET_ON_HANG",
        "After the stacks and the hang report: restart the group, exit (status 124) or report "
        "only (keep running) [restart with --max-restarts > 0, else exit]")
      ->check(CLI::IsMember({"", "restart", "exit", "report"}));
  g.opt("--heartbeat-timeout,--heartbeat_timeout", f.heartbeat_timeout_s, "PET_HEARTBEAT_TIMEOUT",
        "Seconds without a heartbeat before a worker counts as hung; 0 off [0]");
  g.opt("--silence-timeout,--silence_timeout", f.silence_timeout_s, "PET_SILENCE_TIMEOUT",
        "Seconds without output before a worker counts as hung, counted from its first output "
        "(until then --heartbeat-grace applies); 0 off [0]");
  g.opt("--heartbeat-grace,--heartbeat_grace", f.heartbeat_grace_s, "PET_HEARTBEAT_GRACE",
        "Seconds for each worker's first heartbeat and, with --silence-timeout, its first output "
        "(start-up, imports, compilation) [60, never less than the timeout it precedes]");
  g.opt("--stuck-timeout,--stuck_timeout", f.stuck_timeout_s, "PET_STUCK_TIMEOUT",
        "Seconds a worker may stay stopped (T) or in uninterruptible sleep (D); 0 off "
        "[--heartbeat-timeout, else --silence-timeout]");
  g.opt("--stack-capture,--stack_capture", f.stack_capture, "PET_STACK_CAPTURE",
        "How a hung native worker's stacks are captured: auto (eu-stack, else gdb, else /proc), "
        "eu-stack, gdb, proc or none (none also sends Python workers no signal for a live "
        "stack dump) [auto]")
      ->check(CLI::IsMember({"auto", "eu-stack", "gdb", "proc", "none"}));
  g.opt("--straggler-fraction,--straggler_fraction", o.straggler_fraction,
        "PET_STRAGGLER_FRACTION",
        "A rank whose heartbeat step rate is this much below the median is reported as a "
        "straggler (console, events.jsonl, ddprun status); 0 off [0.3]");
  g.opt("--straggler-window,--straggler_window", f.straggler_window_s, "PET_STRAGGLER_WINDOW",
        "Seconds over which step rates are compared [60]");
  g.opt("--progress-interval,--progress_interval", f.progress_interval_s, "PET_PROGRESS_INTERVAL",
        "Seconds between \"progress\" events (each rank's step) in events.jsonl, what "
        "`ddprun report` draws; at most one a second; 0 off [10]");
}

void output_flags(CLI::App& app, agent::Options& o, RawFlags& f) {
  FlagGroup g(app, "Output");
  g.opt("--metrics-port,--metrics_port", o.metrics_port, "PET_METRICS_PORT",
        "Serve the job's Prometheus metrics at http://ADDR:PORT/metrics; 0 picks a free port "
        "(logged) [off]");
  g.opt("--metrics-addr,--metrics_addr", o.metrics_addr, "PET_METRICS_ADDR",
        "Address the metrics are served on (0.0.0.0: every interface) [127.0.0.1]");
  g.opt("--log-dir,--log_dir", o.log_dir, "PET_LOG_DIR",
        "Write <dir>/<run-id>/attempt_<n>/<local_rank>/{stdout,stderr}.log");
  g.opt("-r,--redirects", f.redirects, "PET_REDIRECTS",
        "Keep streams off the console (log file only): 0-3 or <local_rank>:<0-3>,... "
        "(1 stdout, 2 stderr, 3 both) [0]");
  g.opt("-t,--tee", f.tee, "PET_TEE",
        "Streams to the log file AND the console (as torchrun; wins over -r), same values [0]");
  g.opt("--stdin-rank,--stdin_rank", f.stdin_rank, base::kEnvStdinRank,
        "The rank that reads ddprun's standard input (typed input is forwarded), or none; "
        "the others read /dev/null. On a terminal typed keys go to the rank that waits "
        "(pdb, input()), this one first; Ctrl-] then a rank's digit, or Ctrl-] n, switches "
        "between waiting ranks [0]");
  g.opt("--local-ranks-filter,--local_ranks_filter", f.local_ranks_filter, "PET_LOCAL_RANKS_FILTER",
        "Only these local ranks reach the console, e.g. 0 or 0,2 [all]");
  g.opt("--log-line-prefix-template,--log_line_prefix_template", o.log_line_prefix_template,
        "PET_LOG_LINE_PREFIX_TEMPLATE",
        "Console line prefix with ${role_name} ${rank} ${local_rank} ${host} [[${role_name}${local_rank}]:]");
}

// torchrun 2.x's newer flags (docs/TORCHRUN_2.md).
void torchrun2_flags(CLI::App& app, agent::Options& o, RawFlags& f) {
  FlagGroup g(app, "torchrun 2.x");
  g.opt("--numa-binding,--numa_binding", f.numa_binding, "PET_NUMA_BINDING",
        "Bind each worker to CPUs near its GPU (no GPU: NUMA node <local rank> mod <nodes>): "
        "node, socket, exclusive or core-complex")
      ->check(CLI::IsMember({"node", "socket", "exclusive", "core-complex"}));
  g.opt("--event-log-handler,--event_log_handler", f.event_log_handler, "PET_EVENT_LOG_HANDLER",
        "null (events.jsonl only) or console (its lines also on stderr) [null]");
  g.flag("--virtual-local-rank,--virtual_local_rank", o.virtual_local_rank, nullptr,
         "LOCAL_RANK=0 for every worker, CUDA_VISIBLE_DEVICES its one GPU");
  g.opt("--logs-specs,--logs_specs", f.logs_specs, nullptr, "Refused: a Python entry point");
  g.opt("--duplicate-stdout-filters,--duplicate_stdout_filters", f.dup_stdout, nullptr,
        "Refused: not supported yet");
  g.opt("--duplicate-stderr-filters,--duplicate_stderr_filters", f.dup_stderr, nullptr,
        "Refused: not supported yet");
  g.opt("--print-completion,--print_completion", f.print_completion, nullptr, "Refused");
}

}  // namespace

void define_flags(CLI::App& app, agent::Options& o, RawFlags& f) {
  // In this order in --help.
  worker_flags(app, o, f);
  rendezvous_flags(app, o, f);
  program_flags(app, o, f);
  restart_flags(app, o, f);
  hang_flags(app, o, f);
  output_flags(app, o, f);
  torchrun2_flags(app, o, f);
}

std::string expand_prefix(const CLI::App& app, const std::string& name) {
  if (name.size() < 3 || name.rfind("--", 0) != 0 || app.get_option_no_throw(name)) return name;
  const std::string stem = name.substr(2);
  const CLI::Option* match = nullptr;
  std::string first;     // the match's first long name, as --help shows it
  std::string listed;    // every matching option, for the ambiguity error
  bool ambiguous = false;
  for (const CLI::Option* option : app.get_options()) {
    for (const std::string& long_name : option->get_lnames()) {
      if (long_name.rfind(stem, 0) != 0) continue;
      // Both spellings of one flag (--max-r matching only --max-restarts,
      // --nproc matching --nproc-per-node and --nproc_per_node) are one match.
      if (match != option) {
        ambiguous = ambiguous || match != nullptr;
        match = option;
        first = "--" + option->get_lnames().front();
        listed += (listed.empty() ? "" : ", ") + first;
      }
      break;
    }
  }
  if (ambiguous) throw UsageError(name + ": ambiguous flag, could be " + listed);
  return match ? first : name;
}

std::vector<std::string> split_empty_values(const CLI::App& app, int argc,
                                            const char* const* argv) {
  std::vector<std::string> out(argv, argv + argc);
  for (size_t i = 1; i < out.size(); ++i) {
    std::string& arg = out[i];
    if (arg == "--" || arg.size() < 2 || arg[0] != '-') break;
    if (const size_t eq = arg.find('='); arg.rfind("--", 0) == 0)
      arg = expand_prefix(app, arg.substr(0, eq)) + (eq == std::string::npos ? "" : arg.substr(eq));
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const CLI::Option* option = app.get_option_no_throw(name);
    const bool takes_value = option && option->get_expected_min() > 0;
    if (eq == std::string::npos) {
      // `--log-dir DIR` or `-r 3`: the next argument is this flag's value.
      if (takes_value) ++i;
    } else if (eq + 1 == arg.size() && name.rfind("--", 0) == 0 && option) {
      if (takes_value) {
        out[i] = name;
        out.insert(out.begin() + static_cast<std::ptrdiff_t>(++i), "");
      } else {
        out.erase(out.begin() + static_cast<std::ptrdiff_t>(i--));
      }
    }
  }
  return out;
}

}  // namespace ddprun::launcher
