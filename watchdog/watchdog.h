// Watchdog: turns the agent's observations of one attempt's workers into at
// most one HangEvent.
//
// Detectors (each off when its timeout is zero):
//  - progress, learned (the default, a TimeoutLearner given and no fixed
//    heartbeat_timeout): beats of every kind (explicit, automatic from
//    optimizer.step(), forward passes) are progress; sections (checkpoint,
//    ...) have their own learned timeouts. Judged job-wide: while any rank
//    is inside a section, or still in its setup (spawn to first beat), the
//    others' progress deadlines wait, since in the usual script they wait
//    in the next collective for it. This node's ranks are seen directly;
//    other nodes' through on_peer_guards (the agent's hook shares each
//    node's guards() through the job's store, peer_guards.h). A rank whose
//    setup outlasts the setup timeout without one beat is not watched
//    (said once, never killed) until its first beat. (A non-Python program,
//    which gets no automatic beats, is told so at start instead: WatchdogHook.)
//  - heartbeat, fixed: with heartbeat_timeout set, EVERY worker must beat (through
//    heartbeat.h or ddprun_heartbeat.py). Its first beat is due
//    heartbeat_grace after spawn (start-up, imports, compilation), each next
//    one heartbeat_timeout after the previous. A worker that cannot beat
//    should be run without --heartbeat-timeout and watched by the others.
//  - silence: no stdout/stderr output for silence_timeout, counted from
//    each output (the agent calls on_output). It arms at a worker's first
//    output: until then the start-up grace applies (heartbeat_grace, as for
//    the first beat, never shorter than silence_timeout).
//  - process state: the worker's main thread stopped (T/t) or in
//    uninterruptible sleep (D) continuously for stuck_timeout. Sampled from
//    /proc/PID/stat every proc_poll_interval; defaults to the heartbeat
//    timeout, else the silence timeout, else off.
//  - torch's file timer: on_file_timer_expiry from FileTimerServer.
// Heartbeat and silence deadlines use one timer set to exactly the
// earliest due time, so a hang is seen within milliseconds of its timeout;
// beats only move deadlines later, so a beat never re-arms the timer.
//
// The agent's own stalls are not the workers': when a timer fires later than
// pause_threshold after it was due, the agent itself did not run meanwhile
// (SIGSTOPped, frozen with its container, descheduled), so it could not
// read the beats and output the workers sent. Every deadline then restarts
// from that moment, as if each worker had just beaten, printed and left any
// stuck state. (A machine suspend needs nothing: the steady clock stops
// with it.)
//
// Phases (Watchdog::Phase): watching; fired (a hang was handed to the
// owner, every detector disarmed); reported (--on-hang=report: the hang was
// only reported, and watching resumes at the next beat); stopped (the
// attempt ends for another reason). Once a hang fires the agent tears the
// group down and makes a new Watchdog for the next attempt. With
// --restart-scope=rank the agent may instead replace one rank
// (replace_worker): the watchdog then watches the new process from its
// spawn and arms itself again.
//
// The code is in four files: watchdog.cc (workers, beats, phases, the
// process-state poll), watchdog_deadlines.cc (each detector's due time and
// the event of the first one passed), watchdog_protection.cc (sections,
// setups and other nodes' guards that protect the ranks waiting for them)
// and watchdog_blame.cc (which ranks stalled, the culprit, the suspects).
//
// Time comes from a base::Clock (clock.h): SteadyClock in the agent, a
// ManualClock in the unit tests, which then need no waiting.
//
// Thread safety: the clock's thread only (the agent's io_context).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <sys/types.h>
#include <vector>

#include "base/clock.h"
#include "watchdog/file_timer_server.h"
#include "watchdog/heartbeat_server.h"
#include "watchdog/timeout_learner.h"

namespace ddprun::watchdog {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

struct WatchdogOptions {
  // Longest gap between two beats of one worker, fixed (--heartbeat-timeout,
  // --hang-timeout=S); 0: learned when the Watchdog has a learner, else off.
  Millis heartbeat_timeout{0};
  // Deadline of each worker's first beat, and of its first output when the
  // silence detector is on, from spawn; 0 means kDefaultGrace. Never shorter
  // than the timeout it precedes.
  Millis heartbeat_grace{0};
  // Longest stretch without stdout/stderr output; 0 turns it off.
  Millis silence_timeout{0};
  // Longest stretch stopped (T) or in uninterruptible sleep (D); unset means
  // heartbeat_timeout, else silence_timeout; 0 turns it off.
  std::optional<Millis> stuck_timeout;
  // How often /proc/PID/stat is sampled for the process-state detector.
  Millis proc_poll_interval{100};
  // A timer firing this late means the agent itself was paused: deadlines
  // restart from when it resumed. Longer than any scheduling delay of a
  // loaded machine, shorter than any useful timeout.
  Millis pause_threshold{1000};
  // A worker that never beat is not judged by the heartbeat detector, nor
  // by the laggard rule of culprit() and suspects(), until its first beat:
  // `ddprun attach` watches programs it did not start, which may never beat.
  bool beats_optional = false;

  static constexpr Millis kDefaultGrace{60000};
  Millis effective_grace() const;          // first beat
  Millis effective_silence_grace() const;  // first output
  Millis effective_stuck_timeout() const;
  bool any_enabled() const;
};

enum class HangKind { kHeartbeat, kSilence, kStopped, kUninterruptible, kFileTimer, kSection };
const char* to_string(HangKind kind);

// What the watchdog knows about one worker (snapshot for the report).
struct WorkerStatus {
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = 0;
  Clock::time_point spawned{};
  uint64_t beats = 0;               // progress beats (explicit, automatic, forward)
  Clock::time_point last_beat{};  // valid when beats > 0; also moved by section ends
  std::chrono::system_clock::time_point last_beat_wall{};
  int64_t step = -1;      // step of the last beat
  int64_t max_step = -1;  // highest step seen
  Clock::time_point last_output{};
  bool any_output = false;
  char proc_state = '?';
  std::optional<Clock::time_point> stuck_since;
  bool exited = false;
  // Open sections, innermost last (name, start).
  std::vector<std::pair<std::string, Clock::time_point>> sections;
  // Learned mode: setup outlasted its timeout without a beat; not watched
  // until the first beat.
  bool unwatched = false;
  // The node's protection epoch at the last beat (a gap across a section or
  // a peer's setup is not a step duration).
  uint64_t epoch = 0;
};
// "last step N" or "no step reported", as hang messages say it.
std::string step_text(const WorkerStatus& w);

// One rank's protection of its peers: inside a section (its name) or still
// in its setup ("setup"), until the learned timeout of that section or
// setup passes (the rank's own watchdog catches it then).
struct Guard {
  int node = -1;  // the node's group rank (-1: this node)
  int rank = -1;  // global rank
  std::string section;
  Clock::time_point until{};
  bool operator==(const Guard& o) const {
    return node == o.node && rank == o.rank && section == o.section && until == o.until;
  }
};

struct HangEvent {
  HangKind kind = HangKind::kHeartbeat;
  int local_rank = -1;
  int global_rank = -1;
  pid_t pid = 0;
  // The configured limit that passed (0 for torch's file timer).
  Millis timeout{0};
  // When the limit passed, and when the watchdog saw it.
  Clock::time_point due{};
  Clock::time_point detected{};
  // One line: what was observed, e.g. "no heartbeat for 2.00 s (last step 41)".
  std::string detail;
  // Learned mode: the timeout's origin ("step: 41 s, from 1,200 ...").
  std::string learned_from;
  // kSection: the section's name.
  std::string section;
  // blame(): the node whose stall named this rank (peer_stall.h); -1 when
  // this node's own deadline passed.
  int peer_node = -1;
  // Learned mode: fired at the step's learned bound, below the floor,
  // because the evidence said hung (evidence.h); `evidence` says what was seen.
  bool by_evidence = false;
  std::string evidence;
  // The moment the stall's deadline counts from (the job's last progress).
  Clock::time_point stall_from{};

  // An event about worker `w`: its `kind` of limit `timeout` passed at
  // `due`, seen at `detected`.
  static HangEvent about(const WorkerStatus& w, HangKind kind, Millis timeout, Clock::time_point due,
                         Clock::time_point detected, std::string detail);
};

class Watchdog {
 public:
  using HangHandler = std::function<void(const HangEvent&)>;
  // The evidence rule (evidence.h): asked when a step stall passes its
  // learned bound below the floor; calls `done(hung, why)` later, on the
  // clock's thread. Hung fires the event then; alive waits for the floor.
  using Verdict = std::function<void(bool hung, std::string why)>;
  using Judge = std::function<void(const HangEvent&, Verdict done)>;

  // `clock` must outlive the watchdog, and `learner` (optional) too: with
  // one and no fixed heartbeat_timeout, progress is judged by learned
  // timeouts, and what this attempt observes is added to it.
  Watchdog(base::Clock& clock, WatchdogOptions options, HangHandler on_hang,
           TimeoutLearner* learner = nullptr);
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // A worker was spawned; its deadlines start now.
  void add_worker(int local_rank, int global_rank, pid_t pid);
  // Its global rank known only now (attach saw the process before it
  // exec'd with RANK set); its beats match from now on.
  void set_global_rank(int local_rank, int global_rank);
  void on_beat(const Beat& beat);
  void on_output(int local_rank);
  // An exited worker is no longer watched (a finished peer is not a hang).
  void on_worker_exit(int local_rank);
  // --restart-scope=rank: the slot's process was replaced by `pid`, spawned
  // now. Its state starts over (in setup, no beats, no output, no step);
  // what was learned stays. Every other rank's deadlines restart from now
  // (they re-formed their communicator meanwhile, which is no step), and a
  // watchdog that fired (the hang that led here) or was stopped watches
  // again.
  void replace_worker(int local_rank, pid_t pid);
  // --restart-scope=rank on several nodes: another node replaces its failed
  // ranks, and the ranks here wait for that replacement to start and
  // re-form with it. Until each beats again, its heartbeat deadline is no
  // earlier than the first-beat grace from now (what a replacement here
  // gives the survivors, above); every other deadline restarts from now.
  void peer_replacing();
  void on_file_timer_expiry(const FileTimerExpiry& expiry);
  // --restart-scope=rank on several nodes: another node's stalled ranks
  // wait for this local rank (peer_stall.h). A heartbeat hang of it, now,
  // with `detail`; nothing when the watchdog fired or stopped already.
  void blame(int local_rank, int peer_node, std::string detail);
  // The hang it fired was not acted on (another node's rank was the
  // culprit, and that node replaces it): watch again, every deadline from now.
  void withdraw();
  // Disarms every detector (the attempt is ending for another reason).
  void stop();

  bool fired() const { return phase_ == Phase::kFired; }
  // After a hang that only was reported (--on-hang=report): watch on, from
  // the next beat of any rank (no second report for the same stall).
  void rearm_after_report();
  bool learning() const { return learner_ != nullptr && options_.heartbeat_timeout.count() == 0; }
  const TimeoutLearner* learner() const { return learner_; }
  // Called once per attempt with the ranks whose setup passed without a beat
  // (learned mode): the caller says freeze detection is off for them.
  void on_unwatched(std::function<void(const std::vector<int>&, Millis)> f) { on_unwatched_ = std::move(f); }
  // Without a judge, learned step deadlines wait for the floor.
  void set_judge(Judge judge) { judge_ = std::move(judge); }
  // Evidence verdicts asked for this attempt (a test's count).
  int judgements() const { return judgements_; }
  // Learned mode: this node's guards now (sections, setups), for the other
  // nodes; `f` is called with them at once, then whenever they change (a
  // section starts or ends, a first beat, a setup that passed, a timeout
  // that grew).
  std::vector<Guard> guards() const;
  void on_guards_changed(std::function<void(const std::vector<Guard>&)> f);
  // Another node's guards (replacing what it said before), `until` in this
  // watchdog's clock. Each protects this node's ranks until its `until`
  // only: a node that stops telling (its agent died, the store is gone)
  // protects no longer than its own watchdog would have waited.
  void on_peer_guards(int node, std::vector<Guard> guards);
  // Other nodes' guards in force.
  std::vector<Guard> peer_guards() const;
  // Times the agent was found paused, and for how long in all.
  int pauses() const { return pauses_; }
  Clock::duration paused_for() const { return paused_for_; }
  const WatchdogOptions& options() const { return options_; }
  const std::vector<WorkerStatus>& workers() const { return workers_; }
  // Highest step any worker reported this attempt; -1 when none.
  int64_t max_step() const;
  // Global ranks of live workers past a deadline at `now`, the event's first.
  std::vector<int> stalled_ranks(const HangEvent& event) const;
  // Laggard rule: live workers whose step is behind the furthest live
  // worker's; when all agree, the stalled ranks.
  std::vector<int> suspects(const HangEvent& event) const;
  // The one rank to blame, named first everywhere: a rank behind in steps,
  // else the rank in an overdue section, else a live rank that never beat,
  // else the one whose last progress is oldest; the event's rank otherwise.
  int culprit(const HangEvent& event) const;

 private:
  enum class Phase {
    kWatching,  // deadlines and the process-state poll armed
    kReported,  // --on-hang=report: no deadline until the next beat (or output)
    kFired,     // a hang was handed to on_hang_: nothing armed
    kStopped,   // the attempt ends for another reason: nothing armed
  };
  // Fired or stopped: no detector may arm or fire.
  bool disarmed() const { return phase_ == Phase::kFired || phase_ == Phase::kStopped; }

  WorkerStatus* find_local(int local_rank);
  const WorkerStatus* find_local_const(int local_rank) const;
  // Live, and judged by beats (beats_optional leaves out a rank never heard from).
  bool judged_by_beats(const WorkerStatus& w) const;

  // watchdog_deadlines.cc: each detector's due time, the timer, the event.
  std::optional<Clock::time_point> heartbeat_due(const WorkerStatus& w) const;
  std::optional<Clock::time_point> silence_due(const WorkerStatus& w) const;
  std::optional<Clock::time_point> setup_due(const WorkerStatus& w) const;
  // Learned mode.
  struct LearnedDue {
    Clock::time_point due;
    Clock::time_point from;
    bool by_evidence = false;  // the evidence bound, not the full timeout
  };
  std::optional<LearnedDue> learned_deadline(const WorkerStatus& w) const;
  std::optional<Clock::time_point> learned_due(const WorkerStatus& w) const;
  std::optional<Clock::time_point> next_due() const;
  void arm_deadline();
  // Cancels the deadline timer (a later arm_deadline() sets it afresh).
  void disarm_deadline();
  void on_deadline();
  // Setups that passed without a beat at `now`: marked unwatched and said.
  void unwatch_passed_setups(Clock::time_point now);
  // The event of the overdue deadline that passed first at `now`, if any.
  std::optional<HangEvent> first_overdue(Clock::time_point now) const;
  HangEvent learned_event(const WorkerStatus& w, const LearnedDue& due, Clock::time_point now) const;
  void ask_judge(HangEvent event);
  // A timer due at `due` fired at `now`; true when that late means the
  // agent was paused (deadlines then restart from `now`).
  bool agent_was_paused(Clock::time_point due, Clock::time_point now);

  // watchdog_protection.cc: sections, setups and other nodes' guards.
  bool protected_now() const;
  // Drops peer guards whose time passed (a protection change when the last goes).
  void expire_peer_guards(Clock::time_point now);
  // Calls on_guards_changed_ when guards() differ from what it last said.
  void tell_guards();
  void protection_changed(Clock::time_point now);
  // Latest progress beat of any live rank.
  Clock::time_point latest_progress() const;
  bool any_exited() const;

  void on_progress(WorkerStatus& w, const Beat& beat);
  void resume_after_report(Clock::time_point now);
  void poll_proc();
  void schedule_poll();
  void fire(HangEvent event);

  base::Clock& clock_;
  WatchdogOptions options_;
  HangHandler on_hang_;
  TimeoutLearner* learner_ = nullptr;
  std::function<void(const std::vector<int>&, Millis)> on_unwatched_;
  std::function<void(const std::vector<Guard>&)> on_guards_changed_;
  Phase phase_ = Phase::kWatching;
  Judge judge_;
  bool judging_ = false;  // a verdict is pending: deadlines are the full ones meanwhile
  int judgements_ = 0;
  bool said_alive_ = false;  // an alive verdict was said on the console
  // Stalls (by the moment they count from) the evidence said were alive:
  // they wait for the full timeout. Bounded: the oldest go first.
  std::vector<Clock::time_point> alive_stalls_;
  std::vector<Guard> told_guards_;       // what on_guards_changed_ last said
  std::map<int, std::vector<Guard>> peer_guards_;  // by node
  // Learned mode: bumped whenever a section or setup protection begins or
  // ends; progress deadlines count from protection_ended_ at the earliest.
  uint64_t epoch_ = 0;
  std::optional<Clock::time_point> protection_ended_;
  std::unique_ptr<base::Timer> deadline_timer_;
  // The due time deadline_timer_ is armed for (empty: not armed).
  std::optional<Clock::time_point> armed_for_;
  // Samples /proc every proc_poll_interval while armed.
  std::unique_ptr<base::Timer> poll_timer_;
  std::vector<WorkerStatus> workers_;
  // No deadline counts from before this moment: the agent resumed from a
  // pause, a reported stall ended, a rank was replaced.
  std::optional<Clock::time_point> resumed_;
  // The local rank replace_worker() last started (-1: none): until its
  // first beat the survivors wait for it by design, in the new
  // generation's rendezvous, and are judged by its start-up grace.
  int joining_local_rank_ = -1;
  // peer_replacing()'s moment: a rank that has not beaten since is held by
  // the first-beat grace from it.
  std::optional<Clock::time_point> peer_joining_since_;
  int pauses_ = 0;
  Clock::duration paused_for_{};
};

}  // namespace ddprun::watchdog
