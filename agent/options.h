// Everything the agent needs to run one node's workers, as one plain struct.
//
// The launcher (launcher/cli.h) is the only code that reads argv or the
// launcher's environment; it fills this struct, and the agent reads nothing
// else. Every field has torchrun's default where torchrun has the flag.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace ddprun::agent {

// Which of a worker's streams go to a log file: torchrun's Std values.
enum StdMask : int { kStdNone = 0, kStdOut = 1, kStdErr = 2, kStdAll = 3 };

// torchrun's -r/-t value: one mask for every local rank ("3"), or one per
// local rank ("0:1,1:2"; ranks not listed get kStdNone).
struct StdSpec {
  int all = kStdNone;
  std::map<int, int> per_rank;
  bool by_rank = false;

  int for_rank(int local_rank) const {
    if (!by_rank) return all;
    auto it = per_rank.find(local_rank);
    return it == per_rank.end() ? kStdNone : it->second;
  }
};

// --restart-scope: what a failed or hung rank costs (docs/RECOVERY.md).
enum class RestartScope {
  kGroup,  // every rank stops; the group restarts from its checkpoint
  kRank,   // only that rank is replaced; the survivors re-form with it
};

// --on-hang: what a detected freeze does after the stacks and the report.
enum class OnHang {
  kRestart,  // restart the group (counts against --max-restarts)
  kExit,     // end the job with status 124
  kReport,   // only warn, keep the job running
};

// --stack-capture: how a hung native worker's stacks are captured.
enum class StackCapture {
  kAuto,     // eu-stack, else gdb, else /proc
  kEuStack,  // eu-stack, else /proc
  kGdb,      // gdb, else /proc
  kProc,     // the kernel's view from /proc only
  kNone,     // no capture, and no live stack signal to Python workers
};

struct Options {
  // --- Workers -------------------------------------------------------------
  // Workers on this node (--nproc-per-node after auto/cpu/gpu resolution).
  int nproc_per_node = 1;
  // --nnodes MIN:MAX. The agent itself runs one node; rendezvous uses these.
  int min_nodes = 1;
  int max_nodes = 1;
  // --node-rank: this node's group rank with the static backend.
  int node_rank = 0;
  // --role: ROLE_NAME and the console prefix's role part.
  std::string role = "default";

  // --- Program -------------------------------------------------------------
  // The worker's full argv, already decided by the launcher (python -u
  // script.py args..., or the executable and its args). argv[0] is looked up
  // in PATH when it has no slash.
  std::vector<std::string> command;
  // True when the command runs a Python interpreter: hooks use it to decide
  // whether Python-side helpers (the watchdog module) apply.
  bool is_python = false;
  // Where the launcher took a Python program's interpreter from, for
  // messages: "$PYTHON_EXEC", "$DDPRUN_PYTHON" or "the default: python3 from PATH".
  std::string python_source;
  // Folders prepended to PYTHONPATH of Python workers (the watchdog's module
  // folder goes here). Empty: PYTHONPATH is left as inherited.
  std::vector<std::string> pythonpath_prepend;
  // The environment workers inherit before torchrun's variables are added,
  // as "KEY=VALUE" strings (the launcher passes its own environ).
  std::vector<std::string> base_env;

  // --- Rendezvous ----------------------------------------------------------
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;
  // --rdzv-id: TORCHELASTIC_RUN_ID and the log folder name.
  std::string run_id = "none";
  // --rdzv-conf key=value pairs, uninterpreted here (token removed).
  std::map<std::string, std::string> rdzv_conf;
  // Shared secret of the rendezvous store: --rdzv-conf token=..., else
  // $DDPRUN_RDZV_TOKEN. Never logged. Empty: a single node makes a random
  // one; a multi-node job runs without authentication.
  std::string rdzv_token;
  bool standalone = false;
  // --master-addr: MASTER_ADDR for a single-node job.
  std::string master_addr = "127.0.0.1";
  // --master-port. Unset: the agent reserves a free port for the whole job
  // (see port_reservation.h), so concurrent jobs cannot collide.
  std::optional<int> master_port;
  // --local-addr: this node's address as advertised to peers (multi-node).
  std::string local_addr;
  // $DDPRUN_PHASE_TRACE: a file the agent appends its formation phases to
  // (base/phase_trace.h, for bench/agents_scale.py). Empty: no marks.
  std::string phase_trace;

  // --- Restarts and teardown ----------------------------------------------
  // --max-restarts: group restarts after a failure before giving up.
  int max_restarts = 0;
  // --restart-scope: group (every rank restarts) or rank (only the failed
  // or hung one is replaced, the others keep running and are told through
  // the recovery channel; docs/RECOVERY.md; on several nodes the agents
  // keep the generation in step through the store). Each replacement spends one of --max-restarts, as a group restart does.
  RestartScope restart_scope = RestartScope::kGroup;
  // --recovery-timeout: with rank scope, the time from a rank's failure until
  // every rank (of every node) has joined the new generation (the replacement's
  // start-up included); past it the agent falls back to a group restart.
  std::chrono::milliseconds recovery_timeout{300000};
  // --standby-workers: with rank scope only, extra workers started with the
  // group that initialise and wait, rank-less, on their recovery channel; a
  // failed rank's slot goes to one of them (event=assign) instead of a
  // fresh process, and another standby starts once that recovery is over.
  // 0: none, every replacement is spawned (docs/RECOVERY.md).
  int standby_workers = 0;
  // --start-method: accepted for torchrun compatibility; always fork+exec.
  std::string start_method = "spawn";
  // --term-timeout: SIGTERM-to-SIGKILL grace period.
  std::chrono::milliseconds term_timeout{30000};
  // --heartbeat-timeout / --silence-timeout: hang detection (watchdog/);
  // 0 disables. Not interpreted by the agent itself.
  std::chrono::milliseconds heartbeat_timeout{0};
  std::chrono::milliseconds silence_timeout{0};
  // --hang-timeout: unset (auto, the default) learns each timeout from the
  // job's own beats and sections (watchdog/timeout_learner.h); above 0 is
  // one fixed timeout (as --heartbeat-timeout, which wins when both are
  // set); 0 turns freeze detection off.
  std::optional<std::chrono::milliseconds> hang_timeout;
  // --hang-timeout-floor: no learned timeout is shorter.
  std::chrono::milliseconds hang_timeout_floor{60000};
  // --on-hang: what a detected freeze does after the stacks and the report;
  // not given: restart when --max-restarts > 0, else exit (the launcher
  // decides).
  OnHang on_hang = OnHang::kExit;
  // --heartbeat-grace: each worker's FIRST beat (start-up, compilation); 0
  // means max(--heartbeat-timeout, 60 s).
  std::chrono::milliseconds heartbeat_grace{0};
  // --stuck-timeout: how long a worker may stay stopped (T) or in
  // uninterruptible sleep (D); unset means the heartbeat timeout, else the
  // silence timeout; 0 disables.
  std::optional<std::chrono::milliseconds> stuck_timeout;
  // --stack-capture: how a hung native worker's stacks are captured before
  // the teardown. Python workers with faulthandler print their own.
  StackCapture stack_capture = StackCapture::kAuto;
  // --straggler-fraction / --straggler-window: a rank whose heartbeat step
  // rate over the window is this fraction below the median is reported
  // (introspect/step_rates.h); 0 disables. Not interpreted by the agent.
  double straggler_fraction = 0.3;
  std::chrono::milliseconds straggler_window{60000};
  // --progress-interval: the time between "progress" events (every rank's
  // heartbeat step) in events.jsonl, the history `ddprun report` draws;
  // 0 disables. Not interpreted by the agent.
  std::chrono::milliseconds progress_interval{10000};
  // --metrics-port / --metrics-addr: serve the job's Prometheus metrics
  // (observe/metrics_server.h) on this TCP port, -1: off, 0: a free port
  // (logged). Bound to `metrics_addr`, loopback unless given.
  int metrics_port = -1;
  std::string metrics_addr = "127.0.0.1";
  // --restart-backoff: the wait before the second restart (the first is
  // immediate), doubling with each further restart (capped at 30 s).
  std::chrono::milliseconds restart_backoff{100};
  // --max-no-progress-restarts: stop after this many attempts in a row whose
  // highest heartbeat step did not advance; 0 disables.
  int max_no_progress_restarts = 0;
  // --no-restart-exit-codes: a worker exiting with one of these ends the job
  // without restarting (e.g. 2, a usage error).
  std::vector<int> no_restart_exit_codes;
  // --signals-to-handle: signals forwarded to workers before ddprun exits
  // with 128+signal.
  std::vector<int> signals_to_handle;  // launcher fills SIGTERM,SIGINT,SIGHUP,SIGQUIT
  // The same list as given (workers' TORCHELASTIC_SIGNALS_TO_HANDLE, torch 2.x).
  std::string signals_to_handle_spec;

  // --- Output --------------------------------------------------------------
  // --log-dir: per attempt+rank files under <log_dir>/<run_id>/attempt_<n>/
  // <local_rank>/. Empty: console only, error files in a private temp dir.
  std::string log_dir;
  // -r/--redirects: streams kept off the console (they go to the log file).
  StdSpec redirects;
  // -t/--tee: streams that go to the log file AND the console (torchrun's
  // tee; it wins over a redirect of the same stream).
  StdSpec tee;
  // --stdin-rank: the global rank whose standard input is ddprun's (typed
  // input is forwarded when that is a terminal); -1 (none): every rank
  // reads /dev/null.
  int stdin_rank = 0;
  // --local-ranks-filter: local ranks whose output reaches the console;
  // empty means all. Filtered streams still reach their log files.
  std::set<int> local_ranks_filter;
  // --log-line-prefix-template with ${role_name} ${rank} ${local_rank}
  // ${host}. Empty: torchrun's "[<role><local_rank>]:". "none": no prefix,
  // the workers' bytes reach the console untouched (line_splitter.h).
  std::string log_line_prefix_template;
  // This node's host name, for ${host} and the failure summary.
  std::string hostname;

  // --- torchrun 2.x -------------------------------------------------------
  // --numa-binding: the CPUs of each local rank (launcher/numa_binding.h),
  // applied with sched_setaffinity before exec; empty: inherited.
  std::vector<std::vector<int>> worker_cpus;
  // --virtual-local-rank: LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES names the
  // rank's one GPU (the <local rank>th of the agent's list, else its index).
  bool virtual_local_rank = false;
  // --event-log-handler=console: each events.jsonl line also on stderr.
  bool events_to_console = false;
};

}  // namespace ddprun::agent
