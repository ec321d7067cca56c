// IntrospectHook: the agent's side of `ddprun status` and `ddprun stacks`,
// and the straggler detector (agent/hooks.h).
//
// Before the first worker starts it makes "introspect/" in the agent's
// private runtime folder (agent/runtime_dir.h; its own mkdtemp'd 0700
// folder when the agent has none) and its folder for the workers' Python
// stack dumps; workers get DDPRUN_PYSTACK_SIGNAL/DIR (stacks.h). Once the
// first workers are started (off the path to them) it opens the
// control socket (control_wire.h) there and registers the agent in the
// per-user registry (registry.h); both go at destruction.
// Once a second while an attempt runs it samples each worker's /proc (state,
// CPU %, RSS) and its last heartbeat step (from the watchdog), keeps step
// rates and reports stragglers (step_rates.h) on the console and in the
// event log, and every progress_interval a "progress" event with each
// rank's step (the history `ddprun report` draws). It counts hangs, their
// culprits and recoveries from the event log (job_counters.h). In a multi-node round it also publishes that status in the
// job's store and answers a status request with every node's (node_board.h). A stacks request runs the capture on a thread (eu-stack or gdb
// may take seconds) and replies from the loop when it is done.
//
// Thread safety: agent loop thread only, except the capture thread, which
// touches nothing but its own copies and posts its result to the loop.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent/hooks.h"
#include "agent/options.h"
#include "base/liveness.h"
#include "base/off_loop_task.h"
#include "introspect/control_server.h"
#include "introspect/job_counters.h"
#include "introspect/node_board.h"
#include "introspect/registry.h"
#include "introspect/step_rates.h"
#include "watchdog/event_log.h"
#include "watchdog/stack_capture.h"
#include "watchdog/watchdog.h"

namespace ddprun::introspect {

struct MonitorOptions {
  // The job's --rdzv-id / --run-id, as the registry lists it.
  std::string run_id = "none";
  // Registry folder; empty: registry_dir()'s choice.
  std::string registry_dir;
  StragglerOptions straggler;
  // Native stack tools for `ddprun stacks`.
  watchdog::StackCaptureOptions stacks;
  // How often workers' /proc and steps are sampled.
  std::chrono::milliseconds sample_interval{1000};
  // Steps per second in status are over this window.
  std::chrono::milliseconds rate_window{10000};
  // How often a "progress" event (every rank's step) goes to events.jsonl,
  // when some step moved; 0: never. --progress-interval. Checked at each
  // sample, so at most once per sample_interval.
  std::chrono::milliseconds progress_interval{10000};
};

// The monitor's settings from the launcher's options (run id, straggler
// flags, --stack-capture).
MonitorOptions monitor_options_from(const agent::Options& options);

class IntrospectHook : public agent::AgentHooks {
 public:
  // The watchdog's beats (null between attempts) and event log (may be null).
  using BeatSource = std::function<const watchdog::Watchdog*()>;
  using EventSource = std::function<watchdog::EventLog*()>;

  IntrospectHook(boost::asio::io_context& io, MonitorOptions options, BeatSource beats,
                 EventSource events);
  ~IntrospectHook() override;

  void add_worker_env(const agent::AttemptInfo& attempt, int local_rank,
                      agent::EnvMap& env) override;
  void workers_started(const agent::AttemptInfo& attempt,
                       agent::AttemptControl& control) override;
  void worker_exited(const agent::WorkerEnd& end) override;
  // --restart-scope=rank: a replaced rank's row follows the new process.
  void recovery(const agent::RecoveryEvent& event) override;
  void attempt_ended(const agent::AttemptResult& result) override;

  // The runtime folder ("" when it could not be made).
  const std::string& runtime_dir() const { return runtime_dir_; }
  nlohmann::json status() const;

 private:
  struct Worker {
    agent::WorkerInfo info;
    std::string state = "starting";
    double cpu_percent = 0;
    uint64_t rss_bytes = 0;
    uint64_t last_ticks = 0;  // cumulative CPU time at the last sample
    Clock::time_point last_sample{};
    bool sampled = false;
    bool exited = false;
    bool straggler = false;
  };
  // The runtime folder and the stack folder (before the first worker).
  void set_up(const std::string& agent_runtime_dir);
  // The control socket and the registry entry (once workers run).
  void serve();
  void schedule_sample();
  void sample();
  void check_stragglers();
  // A "progress" event when a step moved since the last one and `due`.
  void write_progress(bool due);
  void handle(const nlohmann::json& request, ControlServer::Reply reply);
  void stacks(int rank, ControlServer::Reply reply);
  void status_reply(bool all_nodes, ControlServer::Reply reply);
  // Every node's stacks: this node's capture plus the others' through the store.
  void stacks_all_nodes(int rank, ControlServer::Reply reply);
  const watchdog::WorkerStatus* beat_status(int rank) const;

  boost::asio::io_context& io_;
  MonitorOptions options_;
  BeatSource beats_;
  EventSource events_;
  std::string host_;
  bool set_up_ = false;
  bool serving_ = false;  // serve() ran
  std::string runtime_dir_;
  bool own_runtime_dir_ = false;
  std::unique_ptr<ControlServer> server_;
  std::unique_ptr<Registration> registration_;
  // The round's status board in the job's store (multi-node rounds only).
  std::unique_ptr<NodeBoard> board_;
  int node_ = -1;  // group rank in a multi-node round, else -1
  boost::asio::steady_timer timer_;
  bool sampling_ = false;
  int attempt_ = 0;
  int restarts_ = 0;
  int nodes_ = 1;  // the round's group world size
  JobCounters counters_;
  Clock::time_point last_progress_{};
  std::map<int, int64_t> progress_steps_;  // rank -> step in the last progress event
  std::vector<Worker> workers_;
  StepRates rates_;
  base::OffLoopTask capture_;  // `ddprun stacks`' capture (agent_hook_stacks.cc)
  std::shared_ptr<watchdog::CaptureCancel> cancel_ = std::make_shared<watchdog::CaptureCancel>();
  bool capturing_ = false;
  base::Liveness alive_;
};

}  // namespace ddprun::introspect
