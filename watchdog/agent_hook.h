// The watchdog plugged into the agent (agent/hooks.h): one WatchdogHook per
// job, living as long as the agent.
//
// Per attempt it binds the heartbeat socket (DDPRUN_HEARTBEAT_SOCKET), serves
// torch's file timer when TORCHELASTIC_ENABLE_FILE_TIMER=1 (workers get
// TORCHELASTIC_TIMER_FILE), runs a Watchdog over the workers, and on a hang:
// captures stacks (SIGABRT to faulthandler-enabled Python workers through
// fail_attempt's pre-signal, eu-stack, gdb or /proc for the others, on a
// capture thread that posts the stacks back to the loop), writes
// hang_report.{json,txt} in the attempt's log directory, SIGCONTs stopped
// workers so the teardown reaches them, and fails the attempt with a
// one-paragraph reason that the failure summary shows. In a multi-node
// round with learned timeouts it shares the node's sections and setups with
// the other nodes' agents through the job's store (peer_guards.h), so each
// watchdog judges them job-wide.
//
// Time comes from a base::Clock and the other nodes are reached through a
// PeerChannel (HookSeams): a SteadyClock and PeerGuards in the agent, a
// ManualClock and an in-memory channel in the unit tests. The code is in
// agent_hook.cc (attempts, workers, notices), agent_hook_hang.cc (stacks,
// report, the verdict), agent_hook_peers.cc (other nodes) and
// agent_hook_evidence.cc (the evidence rule's samples).
//
// JobRestartPolicy (job_restart_policy.h) applies restart_rules.h's rules
// using the hook's knowledge of the attempt (hang, highest step).
//
// Thread safety: agent loop thread only (as every hook); the capture thread
// touches nothing of the hook's but posts its result to the loop.
#pragma once

#include <boost/asio/io_context.hpp>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent/hooks.h"
#include "base/clock.h"
#include "base/liveness.h"
#include "base/off_loop_task.h"
#include "watchdog/event_log.h"
#include "watchdog/file_timer_server.h"
#include "watchdog/hang_report.h"
#include "watchdog/heartbeat_server.h"
#include "watchdog/hook_options.h"
#include "watchdog/job_restart_policy.h"
#include "watchdog/peer_guards.h"
#include "watchdog/stack_capture.h"
#include "watchdog/watchdog.h"

namespace ddprun::watchdog {

// What the hook reaches besides the agent, replaceable in tests.
struct HookSeams {
  // The clock of every deadline, hold and notice; null: a SteadyClock on
  // the hook's io_context. Outlives the hook.
  base::Clock* clock = nullptr;
  // Opens this node's channel to the other nodes' agents in a multi-node
  // round; empty: PeerGuards through the job's store.
  OpenPeerChannel open_peers;
  // The writer of events.jsonl and the hang reports; null: a new one
  // (make_watchdog_writer()).
  std::shared_ptr<base::QueuedWriter> files;
};

class WatchdogHook : public agent::AgentHooks {
 public:
  WatchdogHook(boost::asio::io_context& io, HookOptions options, HookSeams seams = {});
  ~WatchdogHook() override;

  void add_worker_env(const agent::AttemptInfo& attempt, int local_rank,
                      agent::EnvMap& env) override;
  void workers_started(const agent::AttemptInfo& attempt,
                       agent::AttemptControl& control) override;
  void output(int local_rank, agent::Stream stream, std::string_view data) override;
  void worker_exited(const agent::WorkerEnd& end) override;
  void log_write_failed(int local_rank, const std::string& path,
                        const std::string& error) override;
  void attempt_failed(const agent::Failure& root) override;
  void attempt_interrupted(int signal) override;
  void recovery(const agent::RecoveryEvent& event) override;
  void attempt_ended(const agent::AttemptResult& result) override;

  // For JobRestartPolicy and tests.
  bool last_attempt_hung() const { return last_hang_.has_value(); }
  int64_t last_attempt_max_step() const { return last_max_step_; }
  EventLog* events() { return events_.get(); }
  // The running attempt's watchdog (its workers' beats), null between
  // attempts; for `ddprun status` (introspect/agent_hook.h).
  const Watchdog* watchdog() const { return dog_.get(); }
  // The last hang's report directory ("" when none).
  const std::string& last_report_dir() const { return last_report_dir_; }
  // The last attempt's hang ends the job (--on-hang=exit): no restart.
  bool last_hang_ends_job() const { return last_hang_ && options_.on_hang == OnHang::kExit; }
  // What the job learned so far (kept across attempts).
  const TimeoutLearner& learner() const { return learner_; }

 private:
  void begin_attempt(const agent::AttemptInfo& attempt);
  void on_hang(const HangEvent& event);
  // The evidence rule's samples and verdict (agent_hook_evidence.cc).
  void judge_stall(const HangEvent& event, Watchdog::Verdict done);
  // A hang ended by the evidence: its verdict and live stacks into the report.
  void take_evidence(HangReport& report);
  // Says once, at the job's first beat, that detection is on and how.
  void say_detection_on(int rank);
  // The stacks, the report and the verdict (on_hang, unless it was held).
  void act_on_hang(const HangEvent& event);
  // The ranks whose stacks a hang's report wants, the event's rank first.
  std::vector<int> ranks_to_capture() const;
  // Starts the capture thread for `natives` (by a tool) and `live` (dumped
  // by the worker itself), each (pid, global rank); finish_hang follows.
  void start_capture(std::vector<std::pair<pid_t, int>> natives,
                     std::vector<std::pair<pid_t, int>> live);
  // finish_hang's request to the attempt: fail it, or replace the culprit.
  agent::FailRequest fail_request(const std::string& summary);
  // Writes the report and fails the attempt, once the stacks are in.
  void finish_hang();
  // Rank scope: the culprit alone is replaced (on_hang is restart).
  bool replaces_culprit() const {
    return options_.rank_scope && options_.on_hang == OnHang::kRestart;
  }
  // The report of a hang whose culprit was replaced: written now, since
  // the attempt goes on (and a later hang may need report_).
  void close_replaced_hang();
  // report_'s faulthandler tracebacks read from the logs (`no_traceback_note`
  // where none is there), its stack culprit, the write off the loop, and
  // the console copy when the logs are not kept.
  void write_report(const char* no_traceback_note);
  // Cancels a capture in progress and joins its thread (bounded).
  void join_capture();
  std::vector<int> all_ranks() const;
  // A worker's core limit to 0 before SIGABRT asks it for a traceback.
  void no_core_dumps(pid_t pid) const;
  void on_unwatched(const std::vector<int>& ranks, Millis setup);
  // Learned detection cannot watch a program that gets no automatic beats
  // (not Python) until it beats itself: said once, if no rank beat within
  // kNativeNoticeAfter of the first workers' start (or the setup window).
  bool native_notice_applies() const;
  void arm_native_notice();
  void say_native_unwatched(Millis waited);
  // events.jsonl and its "start" line; once per job.
  void open_event_log();
  // Multi-node rounds: this node's guards to the others, theirs to dog_
  // (agent_hook_peers.cc).
  void share_guards(const agent::AttemptInfo& attempt);
  void publish_guards(const std::vector<Guard>& guards);
  void on_peer_record(const NodeGuards& record);
  // Rank scope on several nodes (peer_stall.h): holds `event` while the
  // other nodes look for a rank of theirs behind it; false when it is to
  // be acted on now.
  bool defer_hang(const HangEvent& event);
  // Acts on the held hang (`why` says why now), or drops it (`act` false:
  // another node's failure explains it).
  void end_deferral(bool act, const std::string& why);
  // This node acts on a hang of `rank`: the nodes holding theirs wait for
  // its generation.
  void say_blamed(int rank);
  // Says (event log; console once) when ranks here start waiting for
  // another node's section.
  void note_peer_sections(int node, const std::vector<Guard>& guards);

  boost::asio::io_context& io_;
  std::unique_ptr<base::Clock> own_clock_;  // when the seams gave none
  base::Clock& clock_;
  OpenPeerChannel open_peers_;
  HookOptions options_;
  // events.jsonl and the hang reports, written off the loop; before events_,
  // so it outlives it.
  std::shared_ptr<base::QueuedWriter> files_;
  std::unique_ptr<EventLog> events_;
  bool event_log_opened_ = false;  // open_event_log() ran
  // Per job (one run id): learned timeouts survive restarts.
  TimeoutLearner learner_;
  bool said_unwatched_ = false;
  // The notice for a native program is out and no beat came yet.
  bool said_native_off_ = false;
  bool beaten_ = false;  // some rank of this job has beaten
  static constexpr Millis kNativeNoticeAfter{10000};
  std::unique_ptr<base::Timer> native_notice_;
  bool said_peer_section_ = false;
  // Per attempt.
  int attempt_ = -1;
  std::string attempt_dir_;
  agent::AttemptInfo info_;
  agent::AttemptControl* control_ = nullptr;
  std::unique_ptr<Watchdog> dog_;
  std::unique_ptr<HeartbeatServer> heartbeats_;
  std::unique_ptr<FileTimerServer> timers_;
  std::unique_ptr<PeerChannel> peers_;
  uint64_t peers_generation_ = 0;  // a record posted for an older attempt is dropped
  NodeRecord shared_;                 // what peers_ publishes of this node
  std::map<int, PeerStall> peer_stalls_;  // other nodes' stalls, by node
  std::optional<HangEvent> held_hang_;    // defer_hang's
  bool held_for_peer_ = false;            // held_timer_ waits for a blaming node's generation
  std::unique_ptr<base::Timer> held_timer_;
  std::optional<HangReport> report_;
  HangEvent hang_event_;
  std::vector<int> abort_targets_;  // local ranks SIGABRTed for a traceback
  base::OffLoopTask capture_;  // the stack capture tool's run (on_hang)
  base::OffLoopTask evidence_;  // the evidence rule's samples (judge_stall)
  std::vector<RankSample> evidence_samples_;  // the last verdict's second samples
  std::optional<Judgement> judgement_;
  std::shared_ptr<CaptureCancel> capture_cancel_;
  // False once destroyed: a capture's result still queued must not land.
  base::Liveness alive_;
  // Outcome of the attempt that ended last.
  std::optional<HangEvent> last_hang_;
  int64_t last_max_step_ = -1;
  std::string last_report_dir_;
};

}  // namespace ddprun::watchdog
