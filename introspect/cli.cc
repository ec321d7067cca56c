#include "introspect/cli.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include <unistd.h>

#include <set>
#include <thread>

#include <filesystem>

#include "base/contract.h"
#include "base/duration.h"
#include "introspect/attach.h"
#include "introspect/client.h"
#include "introspect/doctor.h"
#include "introspect/registry.h"
#include "introspect/stacks.h"

extern char** environ;

namespace ddprun::introspect {

namespace {

constexpr int kUsageExit = 2;

std::map<std::string, std::string> environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

int doctor_main(int argc, char** argv) {
  CLI::App app("ddprun doctor: pre-flight check of the causes of multi-GPU freezes and NCCL "
               "hangs (IOMMU/ACS, GPU topology, /dev/shm, limits, interfaces, ports, clocks)",
               "ddprun doctor");
  DoctorOptions o;
  o.env = environment();
  if (auto it = o.env.find(base::kEnvDoctorRoot); it != o.env.end()) o.root = it->second;
  bool json = false;
  app.add_option("--root", o.root,
                 "read /sys and /proc below this folder (default $DDPRUN_DOCTOR_ROOT or /)");
  app.add_flag("--json", json, "one JSON object instead of text");
  app.add_option("--port", o.port,
                 "a port this job would bind here (--master-port, or --rdzv-endpoint's port "
                 "on the host that serves it): check it is free [none: ddprun picks a free "
                 "MASTER_PORT]");
  app.add_option("--rdzv-endpoint", o.endpoint,
                 "host[:port] of the rendezvous: measure clock skew with it (SNTP)");
  app.add_option("--nvidia-smi", o.nvidia_smi, "nvidia-smi program ('' to skip)")
      ->capture_default_str();
  app.add_option("--ntp-port", o.ntp_port, "UDP port of the SNTP query")->capture_default_str();
  app.footer("Exit status: 0 nothing failed (warnings allowed), 1 a check failed, 2 wrong flags.");
  for (auto* opt : app.get_options()) opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "ddprun doctor: %s (see ddprun doctor --help)\n", e.what());
    return kUsageExit;
  }
  const auto findings = run_doctor(o);
  if (json) {
    std::cout << to_json(findings).dump(2) << "\n";
  } else {
    std::cout << to_text(findings);
  }
  return exit_status(findings);
}

// Parses into `app`; returns -1 to go on, else the exit status.
int parse(CLI::App& app, int argc, char** argv) {
  for (auto* opt : app.get_options()) opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "%s: %s (see %s --help)\n", app.get_name().c_str(), e.what(),
                 app.get_name().c_str());
    return kUsageExit;
  }
  return -1;
}

struct Target {
  std::string run_id;  // empty: every run
  std::string registry;
  double timeout_s = 10;
};

void add_target_flags(CLI::App& app, Target& t) {
  app.add_option("run_id", t.run_id, "the job's --rdzv-id/--run-id (default: every running job)");
  app.add_option("--registry", t.registry,
                 "registry folder of running agents (default $DDPRUN_REGISTRY_DIR, else "
                 "$XDG_RUNTIME_DIR/ddprun/agents, else /tmp/ddprun-<uid>/agents)");
  app.add_option("--timeout", t.timeout_s, "seconds to wait for each agent's answer")
      ->capture_default_str();
}

// The agents of the target run; prints why there are none.
std::vector<AgentEntry> find_agents(const std::string& cmd, const Target& t) {
  std::vector<AgentEntry> agents;
  try {
    agents = list_agents(registry_dir(t.registry), t.run_id);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun %s: %s\n", cmd.c_str(), e.what());
    return {};
  }
  if (agents.empty()) {
    std::fprintf(stderr, "ddprun %s: no running ddprun agent%s on this host\n", cmd.c_str(),
                 t.run_id.empty() ? "" : (" of run " + t.run_id).c_str());
  }
  return agents;
}

using base::millis_from_seconds;

// Asks every agent; prints each failure; false when none answered.
bool ask_all(const std::string& cmd, const std::vector<AgentEntry>& agents,
             const nlohmann::json& request, double timeout_s, std::vector<nlohmann::json>& out) {
  for (const auto& a : agents) {
    try {
      auto reply = ask_agent(a.socket, request, millis_from_seconds(timeout_s));
      if (reply.contains("error")) {
        std::fprintf(stderr, "ddprun %s: agent %d on %s: %s\n", cmd.c_str(), a.pid,
                     a.host.c_str(), reply["error"].get<std::string>().c_str());
        continue;
      }
      out.push_back(std::move(reply));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ddprun %s: %s\n", cmd.c_str(), e.what());
    }
  }
  return !out.empty();
}

int status_main(int argc, char** argv) {
  CLI::App app("ddprun status: one table of every rank of running jobs (asks their agents)",
               "ddprun status");
  Target t;
  bool json = false, watch = false, local = false;
  double interval = 1.0;
  add_target_flags(app, t);
  app.add_flag("--local", local,
               "this host's agents only (default: every node of a multi-node job, as the "
               "other nodes' agents publish their rows in the job's store)");
  app.add_flag("--json", json, "the agents' replies as one JSON object");
  app.add_flag("--watch", watch, "refresh until the job ends (in place on a terminal)");
  app.add_option("--interval", interval, "seconds between --watch refreshes")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.footer("Exit status: 0 shown, 1 no agent answered, 2 wrong flags.");
  if (int rc = parse(app, argc, argv); rc >= 0) return rc;
  const bool tty = ::isatty(1);
  for (int round = 0;; ++round) {
    const auto agents = find_agents("status", t);
    std::vector<nlohmann::json> replies;
    const nlohmann::json request = {{"op", "status"}, {"nodes", local ? "local" : "all"}};
    if (agents.empty() || !ask_all("status", agents, request, t.timeout_s, replies)) {
      return round > 0 ? 0 : 1;  // --watch: the job ended
    }
    for (const auto& r : replies) {
      if (r.contains("peers_error"))
        std::fprintf(stderr, "ddprun status: other nodes not shown: %s\n",
                     r["peers_error"].get<std::string>().c_str());
    }
    replies = job_agents(replies);
    if (json) {
      std::cout << nlohmann::json{{"agents", replies}}.dump() << std::endl;
    } else {
      // On a terminal --watch redraws in place; into a file each table follows the last.
      if (watch && tty) std::cout << "\x1b[H\x1b[2J";
      std::cout << status_table(replies) << (watch && !tty ? "\n" : "") << std::flush;
    }
    if (!watch) return 0;
    std::this_thread::sleep_for(millis_from_seconds(interval));  // the refresh period itself
  }
}

int stacks_main(int argc, char** argv) {
  CLI::App app("ddprun stacks: Python tracebacks (every thread) and native stacks of a running "
               "job's ranks, without stopping them",
               "ddprun stacks");
  Target t;
  t.timeout_s = 60;
  bool json = false, local = false;
  int rank = -1;
  add_target_flags(app, t);
  app.add_option("--rank", rank, "only this global rank")->check(CLI::NonNegativeNumber);
  app.add_flag("--json", json, "one JSON object");
  app.add_flag("--local", local,
               "this host's ranks only (default: every node of a multi-node job, asked through "
               "the job's store)");
  app.footer("Exit status: 0 stacks shown, 1 no agent or rank answered, 2 wrong flags.");
  if (int rc = parse(app, argc, argv); rc >= 0) return rc;
  auto agents = find_agents("stacks", t);
  if (agents.empty()) return 1;
  std::set<std::string> runs;
  for (const auto& a : agents) runs.insert(a.run_id);
  if (runs.size() > 1) {
    std::string names;
    for (const auto& r : runs) names += (names.empty() ? "" : ", ") + r;
    std::fprintf(stderr, "ddprun stacks: several jobs are running (%s): name one\n",
                 names.c_str());
    return kUsageExit;
  }
  nlohmann::json request = {{"op", "stacks"}, {"rank", rank}, {"nodes", local ? "local" : "all"}};
  std::vector<nlohmann::json> replies;
  if (!ask_all("stacks", agents, request, t.timeout_s, replies)) return 1;
  for (const auto& r : replies)
    for (const auto& e : r.value("errors", nlohmann::json::array()))
      std::fprintf(stderr, "ddprun stacks: %s\n", e.get<std::string>().c_str());
  if (json) {
    std::cout << nlohmann::json{{"agents", replies}}.dump() << std::endl;
    return 0;
  }
  // Two agents of the job on this host both answer for every node: each process once.
  std::set<std::pair<std::string, int64_t>> shown;
  for (const auto& r : replies) {
    for (const auto& s : r["stacks"]) {
      const std::string host = s.value("host", r.value("host", ""));
      if (shown.insert({host, s.value("pid", int64_t{0})}).second)
        std::cout << to_text(stacks_from_json(s), host);
    }
  }
  return 0;
}

int attach_main(int argc, char** argv) {
  CLI::App app("ddprun attach: the hang watchdog for processes ddprun did not start (a torchrun, "
               "srun or mpirun job): no CPU and no I/O progress, state T/D, a log file that "
               "stops growing; on a hang a report with every rank's stacks, then --on-hang",
               "ddprun attach");
  AttachOptions o;
  std::vector<int> pids;
  double silence = 60, stuck = -1, poll = 0.2, grace = 10, command_timeout = 60;
  std::string on_hang = "nothing", stack_capture = "auto";
  app.add_option("pid", pids, "processes to watch with their trees (e.g. torchrun's pid)");
  app.add_option("--pgid", o.pgid, "also watch every process of this process group");
  std::string slurm_step;
  app.add_option("--slurm-step", slurm_step,
                 "also watch this node's processes of Slurm step JOBID[.STEPID|.batch] (found by "
                 "SLURM_JOB_ID/SLURM_STEP_ID in their environment)");
  app.add_option("--silence-timeout", silence,
                 "seconds without CPU time and I/O progress that make a hang")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--stuck-timeout", stuck,
                 "seconds in state T (stopped) or D (uninterruptible) that make a hang; 0 off "
                 "[--silence-timeout]");
  app.add_option("--watch-file", o.watch_files,
                 "a log file that must change within --silence-timeout (repeatable)");
  double heartbeat_timeout = 60;
  app.add_option("--heartbeat-socket", o.heartbeat_socket,
                 "bind this AF_UNIX socket for beats of workers started with "
                 "DDPRUN_HEARTBEAT_SOCKET set to it (ddprun_heartbeat.beat(step))");
  app.add_option("--heartbeat-timeout", heartbeat_timeout,
                 "seconds without a beat from a rank that has beaten before that make a hang")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--on-hang", on_hang, "after the report: nothing (keep watching), kill "
                 "(SIGTERM the trees, SIGKILL after --kill-grace) or command")
      ->check(CLI::IsMember({"nothing", "kill", "command"}))->capture_default_str();
  app.add_option("--hang-command", o.command, "for --on-hang command: run with /bin/sh -c, "
                 "with DDPRUN_HANG_RANK, DDPRUN_HANG_PID, DDPRUN_HANG_REPORT set");
  app.add_option("--command-timeout", command_timeout, "seconds --hang-command may run")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--kill-grace", grace, "seconds between SIGTERM and SIGKILL")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--report-dir", o.report_dir, "write hang_report.txt and hang_report.json here")
      ->check(CLI::ExistingDirectory);
  app.add_option("--poll-interval", poll, "seconds between /proc samples")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--stack-capture", stack_capture, "native stacks: auto, eu-stack, gdb, proc, none")
      ->check(CLI::IsMember({"auto", "eu-stack", "gdb", "proc", "none"}))->capture_default_str();
  app.add_flag("--once", o.once, "exit after the first hang is handled");
  app.footer(std::string("Python stacks: read from outside by py-spy, else pystack, found on PATH (") +
             watchdog::kPythonStackInstall +
             "; they need ptrace rights: docs/introspect.md); a job started with ddprun's "
             "sitecustomize gives the cheaper faulthandler dump instead: PYTHONPATH=" +
             python_dir() + ", DDPRUN_PYSTACK_SIGNAL=" + std::to_string(pystack_signal()) +
             ", DDPRUN_PYSTACK_DIR=<a folder of yours>.\n"
             "Exit status: 0 the processes ended without a hang, 1 a hang was reported, "
             "2 wrong flags, no such process or a --report-dir attach may not write into, "
             "3 a hang was reported but its report could not be written.");
  if (int rc = parse(app, argc, argv); rc >= 0) return rc;
  if (on_hang == "command" && o.command.empty()) {
    std::fprintf(stderr, "ddprun attach: --on-hang command needs --hang-command\n");
    return kUsageExit;
  }
  if (!slurm_step.empty()) {
    o.slurm_step = parse_slurm_step(slurm_step);
    if (!o.slurm_step) {
      std::fprintf(stderr, "ddprun attach: --slurm-step %s: expected JOBID, JOBID.STEPID or "
                   "JOBID.batch\n", slurm_step.c_str());
      return kUsageExit;
    }
  }
  for (int p : pids) o.pids.push_back(p);
  o.silence_timeout = millis_from_seconds(silence);
  o.heartbeat_timeout = millis_from_seconds(heartbeat_timeout);
  if (stuck >= 0) o.stuck_timeout = millis_from_seconds(stuck);
  o.poll_interval = millis_from_seconds(poll);
  o.kill_grace = millis_from_seconds(grace);
  o.command_timeout = millis_from_seconds(command_timeout);
  o.on_hang = on_hang == "kill"      ? AttachOnHang::kKill
              : on_hang == "command" ? AttachOnHang::kCommand
                                     : AttachOnHang::kNothing;
  if (stack_capture == "eu-stack") o.stacks.native.gdb.clear();
  if (stack_capture == "gdb") o.stacks.native.eu_stack.clear();
  if (stack_capture == "proc") o.stacks.native.eu_stack.clear(), o.stacks.native.gdb.clear();
  o.stacks.want_native = stack_capture != "none";
  // The native tools' output files: the report folder, else a private one.
  std::string scratch;
  if (o.report_dir.empty()) {
    const char* tmp = std::getenv(base::kEnvTmpDir);
    scratch = std::string(tmp && *tmp ? tmp : "/tmp") + "/ddprun-attach-XXXXXX";
    if (::mkdtemp(scratch.data()) == nullptr) scratch.clear();
  }
  o.stacks.dir = scratch.empty() ? o.report_dir : scratch;
  int rc;
  try {
    rc = run_attach(o, std::cout);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "ddprun attach: %s\n", e.what());
    rc = kUsageExit;
  }
  if (!scratch.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(scratch, ignored);
  }
  return rc;
}

}  // namespace

bool is_subcommand(const std::string& a) {
  return a == "status" || a == "stacks" || a == "attach" || a == "doctor";
}

int run_subcommand(int argc, char** argv) {
  const std::string name = argv[0];
  if (name == "doctor") return doctor_main(argc, argv);
  if (name == "status") return status_main(argc, argv);
  if (name == "stacks") return stacks_main(argc, argv);
  if (name == "attach") return attach_main(argc, argv);
  std::fprintf(stderr, "ddprun: unknown subcommand %s\n", name.c_str());
  return kUsageExit;
}

}  // namespace ddprun::introspect
