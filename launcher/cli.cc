#include "launcher/cli.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "agent/exit_status.h"
#include "agent/rendezvous_store.h"
#include "base/contract.h"
#include "base/duration.h"
#include "base/safe_file.h"
#include "base/version.h"
#include "rendezvous/rendezvous.h"
#include "launcher/command.h"
#include "launcher/flags.h"
#include "launcher/nproc.h"
#include "launcher/numa_binding.h"
#include "launcher/slurm_env.h"

extern char** environ;

namespace ddprun::launcher {
namespace {

using agent::StdSpec;

// The subcommands introspect/cli.h and observe/report_cli.h run (each has its own --help).
// Shown under the usage line, before the flags: the first thing --help says.
constexpr const char* kSubcommands = R"(
Subcommands (ddprun SUBCOMMAND --help for their flags):
  ddprun status [RUN]      one table of every rank of running jobs: state, step, beat age, steps/s
  ddprun stacks RUN        every rank's Python and native stacks, without stopping the job
  ddprun attach PID        watch a job ddprun did not start (torchrun, srun) and report its hang
  ddprun doctor            check this machine for the causes of multi-GPU freezes
  ddprun report RUN_DIR    one HTML page of a run: timelines per rank, step times, hangs, restarts
)";

constexpr const char* kFooter = R"(Everything after the program is passed to it untouched.
An empty value (--log-dir=) means the flag's default; it never takes the next argument.
A program ending in .py, or a file exec cannot run (no execute bit or no #!), runs as
`<python> -u program` (as torchrun): $PYTHON_EXEC, else $DDPRUN_PYTHON, else python3 from PATH.

Exit status:
  0        every worker exited 0
  N        the root cause (first failing worker) exited N; 128+N if it died of signal N
  128+N    ddprun received signal N (one of --signals-to-handle) and stopped the workers
  124      a freeze was detected and ended the job (--on-hang; hang_report.txt says where)
  126/127  the program cannot be executed / was not found
  2        wrong or conflicting flags
  1        any other error of ddprun itself
Flags also read PET_<FLAG> from the environment (e.g. PET_NPROC_PER_NODE=4).)";

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

int to_int(const std::string& flag, const std::string& v, int min) {
  char* end = nullptr;
  long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < min || n > 1000000)
    throw UsageError(flag + "=" + v + ": expected an integer >= " + std::to_string(min));
  return static_cast<int>(n);
}

StdSpec parse_std(const std::string& flag, const std::string& v) {
  StdSpec spec;
  auto mask = [&](const std::string& m) {
    if (m.size() != 1 || m[0] < '0' || m[0] > '3')
      throw UsageError(flag + "=" + v + ": expected 0-3 or <local_rank>:<0-3>,... "
                       "(1 stdout, 2 stderr, 3 both)");
    return m[0] - '0';
  };
  if (v.find(':') == std::string::npos) {
    spec.all = mask(v);
    return spec;
  }
  spec.by_rank = true;
  for (const auto& item : split(v, ',')) {
    auto colon = item.find(':');
    if (colon == std::string::npos) mask("");
    spec.per_rank[to_int(flag, item.substr(0, colon), 0)] = mask(item.substr(colon + 1));
  }
  return spec;
}

std::string random_run_id() {
  // getrandom, not std::random_device: its cpuid probe costs ~20 us in a VM
  // at every start.
  const std::string h = base::random_hex(16);
  return h.substr(0, 8) + "-" + h.substr(8, 4) + "-" + h.substr(12, 4) + "-" + h.substr(16, 4) +
         "-" + h.substr(20);
}

// torchrun 2.x flags into `o` (after interpret: needs nproc_per_node).
void apply_torch2_flags(const RawFlags& f, agent::Options& o) {
  if (!f.logs_specs.empty())
    throw UsageError("--logs-specs=" + f.logs_specs + ": names a Python entry point "
                     "(torchrun.logs_specs) that ddprun cannot load; use --log-dir, "
                     "--redirects, --tee and --local-ranks-filter");
  for (const auto& [flag, v] : {std::pair{"--duplicate-stdout-filters", &f.dup_stdout},
                                std::pair{"--duplicate-stderr-filters", &f.dup_stderr}})
    if (!v->empty())
      throw UsageError(std::string(flag) + "=" + *v + ": not supported by ddprun yet; "
                       "--log-dir keeps every line in <dir>/<run>/attempt_<n>/<rank>/");
  if (!f.print_completion.empty())
    throw UsageError("--print-completion: not available in ddprun (no shell completion yet)");
  if (f.event_log_handler != "null" && f.event_log_handler != "console")
    throw UsageError("--event-log-handler=" + f.event_log_handler + ": not available in ddprun "
                     "(torch's handlers are Python); use null or console");
  o.events_to_console = f.event_log_handler == "console";
  // A newline in it would forge a console line wherever the path is logged.
  if (base::find_control_character(o.log_dir) >= 0)
    throw UsageError("--log-dir=" + base::printable(o.log_dir) +
                     ": holds a control character; refusing it");
  if (const char* v = std::getenv(base::kEnvCudaVisibleDevices); o.virtual_local_rank && v &&
      static_cast<int>(split(v, ',').size()) < o.nproc_per_node)
    throw UsageError("--virtual-local-rank: CUDA_VISIBLE_DEVICES=" + std::string(v) +
                     " names fewer GPUs than --nproc-per-node=" + std::to_string(o.nproc_per_node));
  if (!f.numa_binding.empty()) {
    cpu_set_t mask;
    std::set<int> allowed;
    if (sched_getaffinity(0, sizeof mask, &mask) == 0)
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &mask)) allowed.insert(c);
    o.worker_cpus = numa_cpu_sets(f.numa_binding, o.nproc_per_node, "/", allowed);
  }
}

// --nnodes, --nproc-per-node and the run id (--standalone makes its own).
void interpret_nodes(const RawFlags& f, agent::Options& o) {
  auto nn = split(f.nnodes, ':');
  if (nn.empty() || nn.size() > 2 || f.nnodes.back() == ':')
    throw UsageError("--nnodes=" + f.nnodes + ": expected N or MIN:MAX");
  o.min_nodes = to_int("--nnodes", nn[0], 1);
  o.max_nodes = nn.size() == 2 ? to_int("--nnodes", nn[1], 1) : o.min_nodes;
  if (o.min_nodes > o.max_nodes)
    throw UsageError("--nnodes=" + f.nnodes + ": MIN is larger than MAX");
  if (f.nproc.empty())
    throw UsageError("--nproc-per-node is empty: expected an integer, auto, cpu or gpu "
                     "(an unset variable in --nproc-per-node=$N?)");
  o.nproc_per_node = resolve_nproc(f.nproc, std::getenv(base::kEnvCudaVisibleDevices),
                                   static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  if (o.standalone) {
    if (o.max_nodes != 1) throw UsageError("--standalone needs --nnodes=1");
    // torchrun: a fresh c10d rendezvous on localhost; explicit values ignored.
    o.rdzv_backend = "c10d";
    o.rdzv_endpoint = "localhost:0";
    o.run_id = random_run_id();
  } else if (o.max_nodes == 1 && o.run_id == "none") {
    // One node and no --rdzv-id: nothing to share it with, and a fresh id
    // keeps each job's log folder and the trainer's checkpoints apart.
    o.run_id = random_run_id();
  }
}

// The longest duration a flag may give (about 11.6 days), as for
// --rdzv-conf: past it millisecond deadlines overflow or mean nothing.
constexpr double kMaxSeconds = rendezvous::kMaxConfSeconds;

// A duration flag: finite, >= `min`, <= kMaxSeconds; the error names the
// flag, its value and the range (inf and nan included).
void check_seconds(const char* flag, double v, double min) {
  if (std::isfinite(v) && v >= min && v <= kMaxSeconds) return;
  std::ostringstream s;
  s << flag << "=" << v << ": expected seconds, a number >= " << min << " and <= "
    << static_cast<int64_t>(kMaxSeconds);
  throw UsageError(s.str());
}

// Numbers CLI11 wrote (into `o`, or as seconds into `f`), checked for their ranges.
void check_ranges(const RawFlags& f, const agent::Options& o) {
  if (o.node_rank < 0) throw UsageError("--node-rank must be >= 0");
  if (o.max_restarts < 0) throw UsageError("--max-restarts must be >= 0");
  check_seconds("--monitor-interval", f.monitor_interval_s, 0);
  check_seconds("--term-timeout", f.term_timeout_s, 0);
  check_seconds("--heartbeat-timeout", f.heartbeat_timeout_s, 0);
  check_seconds("--silence-timeout", f.silence_timeout_s, 0);
  check_seconds("--heartbeat-grace", f.heartbeat_grace_s, 0);
  // -1 is the "not given" default (then the heartbeat or silence timeout).
  if (f.stuck_timeout_s != -1) check_seconds("--stuck-timeout", f.stuck_timeout_s, 0);
  check_seconds("--restart-backoff", f.restart_backoff_s, 0);
  check_seconds("--recovery-timeout", f.recovery_timeout_s, 0.001);
  if (o.standby_workers < 0 || o.standby_workers > 64)
    throw UsageError("--standby-workers=" + std::to_string(o.standby_workers) +
                     ": expected 0 to 64");
  check_seconds("--straggler-window", f.straggler_window_s, 2);
  if (o.straggler_fraction < 0 || o.straggler_fraction >= 1)
    throw UsageError("--straggler-fraction must be >= 0 and < 1");
  if (f.straggler_window_s < 2) throw UsageError("--straggler-window must be >= 2 (seconds)");
  if (o.max_no_progress_restarts < 0) throw UsageError("--max-no-progress-restarts must be >= 0");
  check_seconds("--progress-interval", f.progress_interval_s, 0);
  if (f.progress_interval_s > 0 && f.progress_interval_s < 0.1)
    throw UsageError("--progress-interval must be 0 (off) or >= 0.1 (seconds)");
  if (o.metrics_port < -1 || o.metrics_port > 65535)
    throw UsageError("--metrics-port=" + std::to_string(o.metrics_port) + ": not a TCP port");
  if (f.master_port != -1 && (f.master_port < 0 || f.master_port > 65535))
    throw UsageError("--master-port=" + std::to_string(f.master_port) + ": not a TCP port");
}

// --hang-timeout=auto|S, --hang-timeout-floor, --on-hang, --stack-capture, and the
// watchdog's durations, each turned into its type once.
void interpret_hang(const RawFlags& f, agent::Options& o) {
  if (f.hang_timeout == "auto") {
    o.hang_timeout.reset();
  } else {
    char* end = nullptr;
    const double v = std::strtod(f.hang_timeout.c_str(), &end);
    if (f.hang_timeout.empty() || *end != '\0' || !(v >= 0) || v > 1e7)
      throw UsageError("--hang-timeout=" + f.hang_timeout + ": expected auto or seconds >= 0");
    o.hang_timeout = base::millis_from_seconds(v);
  }
  if (!(f.hang_timeout_floor_s > 0) || f.hang_timeout_floor_s > 1e7)
    throw UsageError("--hang-timeout-floor must be > 0 (seconds)");
  // The one conversion of the watchdog's seconds (checked by check_ranges).
  o.hang_timeout_floor = base::millis_from_seconds(f.hang_timeout_floor_s);
  o.heartbeat_timeout = base::millis_from_seconds(f.heartbeat_timeout_s);
  o.silence_timeout = base::millis_from_seconds(f.silence_timeout_s);
  o.heartbeat_grace = base::millis_from_seconds(f.heartbeat_grace_s);
  if (f.stuck_timeout_s != -1) o.stuck_timeout = base::millis_from_seconds(f.stuck_timeout_s);
  o.straggler_window = base::millis_from_seconds(f.straggler_window_s);
  o.restart_backoff = base::millis_from_seconds(f.restart_backoff_s);
  o.progress_interval = base::millis_from_seconds(f.progress_interval_s);
  o.recovery_timeout = base::millis_from_seconds(f.recovery_timeout_s);
  o.term_timeout = base::millis_from_seconds(f.term_timeout_s);
  // CLI11 checked the words (IsMember); not given: restart where a restart
  // is left.
  using agent::OnHang;
  if (f.on_hang == "restart") {
    o.on_hang = OnHang::kRestart;
  } else if (f.on_hang == "exit") {
    o.on_hang = OnHang::kExit;
  } else if (f.on_hang == "report") {
    o.on_hang = OnHang::kReport;
  } else {
    o.on_hang = o.max_restarts > 0 ? OnHang::kRestart : OnHang::kExit;
  }
  using agent::StackCapture;
  o.stack_capture = f.stack_capture == "eu-stack" ? StackCapture::kEuStack
                    : f.stack_capture == "gdb"    ? StackCapture::kGdb
                    : f.stack_capture == "proc"   ? StackCapture::kProc
                    : f.stack_capture == "none"   ? StackCapture::kNone
                                                  : StackCapture::kAuto;
}

// --rdzv-conf (its token kept apart), --master-port, and what a multi-node
// job needs of the backend and endpoint.
void interpret_rendezvous(const RawFlags& f, agent::Options& o) {
  for (const auto& kv : split(f.rdzv_conf, ',')) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UsageError("--rdzv-conf: '" + kv + "' is not <key>=<value>");
    o.rdzv_conf[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  if (f.master_port != -1) o.master_port = f.master_port;
  // The store's shared secret: never echoed, kept out of rdzv_conf.
  if (auto it = o.rdzv_conf.find("token"); it != o.rdzv_conf.end()) {
    if (it->second.empty()) throw UsageError("--rdzv-conf token= is empty");
    o.rdzv_token = it->second;
    o.rdzv_conf.erase(it);
  } else if (const char* t = std::getenv(base::kEnvRdzvToken)) {
    // Empty would silently turn authentication off.
    if (*t == '\0')
      throw UsageError(std::string(base::kEnvRdzvToken) +
                       " is set but empty: give the shared secret or unset it");
    o.rdzv_token = t;
  }
  if (const char* trace = std::getenv(base::kEnvPhaseTrace)) o.phase_trace = trace;
  // Unknown keys and malformed values are wrong flags (exit 2), found here
  // rather than when the rendezvous starts.
  try {
    rendezvous::RendezvousOptions checked;
    rendezvous::apply_rdzv_conf(o.rdzv_conf, checked);
  } catch (const rendezvous::RendezvousError& e) {
    throw UsageError(e.what());
  }
  if (o.max_nodes <= 1) return;
  if (o.rdzv_backend == "static") {
    // torchrun's static backend meets at --master-addr:--master-port; we
    // host our store there and let rank 0's node pick MASTER_PORT.
    if (o.min_nodes != o.max_nodes)
      throw UsageError("--rdzv-backend=static needs a fixed --nnodes=N, not " + f.nnodes);
    if (o.rdzv_endpoint.empty())
      o.rdzv_endpoint = o.master_addr + ":" + std::to_string(o.master_port.value_or(29500));
    o.master_port.reset();
  } else if (o.rdzv_backend != "c10d" && !agent::is_etcd_backend(o.rdzv_backend)) {
    throw UsageError("--rdzv-backend=" + o.rdzv_backend +
                     ": not supported; use c10d (ddprun hosts its own store), etcd (an etcd "
                     "cluster; etcd-v2 is the same) or static");
  }
  if (o.rdzv_endpoint.empty())
    throw UsageError("--nnodes=" + f.nnodes + " needs --rdzv-endpoint=HOST:PORT" +
                     (agent::is_etcd_backend(o.rdzv_backend) ? "[,HOST:PORT...] (etcd's client URLs)"
                                                             : ""));
}

// --no-restart-exit-codes, --signals-to-handle and --restart-scope.
void interpret_restarts(const RawFlags& f, agent::Options& o) {
  o.restart_scope =
      f.restart_scope == "rank" ? agent::RestartScope::kRank : agent::RestartScope::kGroup;
  // A standby only ever takes a failed rank's slot, which group scope never
  // keeps.
  if (o.standby_workers > 0 && o.restart_scope != agent::RestartScope::kRank)
    throw UsageError("--standby-workers=" + std::to_string(o.standby_workers) +
                     ": needs --restart-scope=rank");
  for (const auto& c : split(f.no_restart_exit_codes, ','))
    o.no_restart_exit_codes.push_back(to_int("--no-restart-exit-codes", c, 0));
  for (const auto& name : split(f.signals, ',')) {
    int sig = agent::parse_signal(name);
    if (sig == 0) throw UsageError("--signals-to-handle: unknown signal '" + name + "'");
    if (sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD)
      throw UsageError("--signals-to-handle: " + name + " cannot be handled");
    o.signals_to_handle.push_back(sig);
  }
  o.signals_to_handle_spec = f.signals;
}

// -r, -t, --stdin-rank and --local-ranks-filter.
void interpret_output(const RawFlags& f, agent::Options& o) {
  o.redirects = parse_std("--redirects", f.redirects);
  o.tee = parse_std("--tee", f.tee);
  o.stdin_rank = f.stdin_rank == "none" ? -1 : to_int("--stdin-rank", f.stdin_rank, 0);
  for (const auto& r : split(f.local_ranks_filter, ','))
    o.local_ranks_filter.insert(to_int("--local-ranks-filter", r, 0));
}

// The workers' argv from the program, its arguments and the interpreter.
void interpret_program(const RawFlags& f, const std::vector<std::string>& rest,
                       agent::Options& o) {
  CommandSpec spec = f.program;
  spec.program = rest[0];
  spec.args.assign(rest.begin() + 1, rest.end());
  const char* path = std::getenv("PATH");
  spec.python_file = !spec.no_python && !spec.module && !spec.run_path &&
                     runs_with_python(spec.program, path ? path : "");
  // torchrun's PYTHON_EXEC first, so scripts written for torchrun pick the
  // same interpreter; then ddprun's own variable; then python3 from PATH.
  o.python_source = "the default: python3 from PATH";
  if (const char* py = std::getenv(base::kEnvPythonExec); py && *py) {
    spec.python = py;
    o.python_source = std::string("$") + base::kEnvPythonExec;
  } else if (const char* ddp = std::getenv(base::kEnvDdprunPython); ddp && *ddp) {
    spec.python = ddp;
    o.python_source = std::string("$") + base::kEnvDdprunPython;
  }
  try {
    Command cmd = build_command(spec);
    o.command = cmd.argv;
    o.is_python = cmd.is_python;
    // `ddprun python3 x.py`: the interpreter is the one the user named.
    if (cmd.is_python && cmd.argv.front() == spec.program) o.python_source = "the command line";
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

// Completes `o`, whose bound flags CLI11 has set, from the rest of the flags.
void interpret(const RawFlags& f, const std::vector<std::string>& rest, agent::Options& o) {
  if (rest.empty())
    throw UsageError("missing the training program (usage: ddprun [flags] program [args...])");
  if (rest[0].size() > 1 && rest[0][0] == '-')
    throw UsageError("unknown flag " + rest[0]);
  interpret_nodes(f, o);
  check_ranges(f, o);
  interpret_hang(f, o);
  interpret_rendezvous(f, o);
  interpret_restarts(f, o);
  interpret_output(f, o);
  interpret_program(f, rest, o);
  for (char** e = environ; e && *e; ++e) o.base_env.emplace_back(*e);
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) == 0) o.hostname = host;
}

// Under srun, what the user left unsaid (no flag, no PET_* variable) comes
// from Slurm (launcher/slurm_env.h); one note says what was taken.
void take_from_slurm(const CLI::App& app, agent::Options& o, RawFlags& f,
                     std::vector<std::string>& notes) {
  std::optional<SlurmStep> step;
  try {
    step = slurm_step([](const char* name) { return std::getenv(name); });
  } catch (const SlurmError& e) {
    throw UsageError(e.what());
  }
  if (!step) return;
  auto unset = [&](const char* name) { return app.get_option(name)->count() == 0; };
  std::vector<std::string> took;
  if (unset("--nnodes")) {
    f.nnodes = std::to_string(step->nnodes);
    took.push_back("--nnodes=" + f.nnodes);
  }
  if (unset("--node-rank")) {
    o.node_rank = step->node_rank;
    took.push_back("--node-rank=" + std::to_string(o.node_rank));
  }
  const bool elastic = unset("--rdzv-backend") || o.rdzv_backend == "c10d";
  if (unset("--rdzv-backend")) {
    o.rdzv_backend = "c10d";
    took.push_back("--rdzv-backend=c10d");
  }
  if (elastic && unset("--rdzv-endpoint")) {
    o.rdzv_endpoint = step->first_host + ":" + std::to_string(step->port);
    took.push_back("--rdzv-endpoint=" + o.rdzv_endpoint);
  }
  if (!elastic && unset("--master-addr")) {  // static meets at --master-addr
    o.master_addr = step->first_host;
    took.push_back("--master-addr=" + o.master_addr);
  }
  if (unset("--rdzv-id")) {
    o.run_id = step->run_id;
    took.push_back("--rdzv-id=" + o.run_id);
  }
  // Slurm's early warning (--signal=USR1@90) must reach the workers, not
  // kill the agent with the signal's default action.
  if (unset("--signals-to-handle")) {
    f.signals += ",SIGUSR1,SIGUSR2";
    took.push_back("--signals-to-handle=" + f.signals);
  }
  if (took.empty()) return;
  std::string line = "from Slurm:";
  for (const auto& t : took) line += " " + t;
  notes.push_back(line + " (flags and PET_* variables override)");
}

// CLI11 2.1 cannot set the usage line; it would say "ddprun [OPTIONS]".
// The subcommands follow it.
class Formatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string) const override {
    return std::string("Usage: ddprun [flags] program [args...]\n") + kSubcommands;
  }
};

}  // namespace

ParseResult parse_command_line(int argc, const char* const* argv) {
  CLI::App app("ddprun: start N data-parallel workers on this node, like torchrun; "
               "restart the whole group on failure",
               "ddprun");
  app.footer(kFooter);
  app.set_version_flag("--version", std::string("ddprun ") + base::version(),
                       "print ddprun's version (release and git commit) and exit");
  app.prefix_command();
  auto formatter = std::make_shared<Formatter>();
  formatter->column_width(44);
  app.formatter(formatter);
  ParseResult result;
  agent::Options& options = result.options;
  RawFlags raw;
  define_flags(app, options, raw);
  const std::vector<std::string> args = split_empty_values(app, argc, argv);
  std::vector<const char*> arg_ptrs;
  for (const auto& a : args) arg_ptrs.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  } catch (const CLI::CallForHelp&) {
    result.help = true;
    result.help_text = app.help();
    return result;
  } catch (const CLI::CallForVersion& e) {  // printed and exit 0, as --help
    result.help = true;
    result.help_text = std::string(e.what()) + "\n";
    return result;
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  std::vector<std::string> rest = app.remaining();
  if (!rest.empty() && rest[0] == "--") rest.erase(rest.begin());
  if (!options.standalone) take_from_slurm(app, options, raw, result.notes);
  interpret(raw, rest, options);
  apply_torch2_flags(raw, options);
  return result;
}

}  // namespace ddprun::launcher
