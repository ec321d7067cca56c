// Watchdog: turns the agent's observations of one attempt's workers into at
// most one HangEvent.
//
// Detectors (each off when its timeout is zero):
//  - heartbeat: with heartbeat_timeout set, EVERY worker must beat (through
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
// Once a hang fires the watchdog disarms itself; the agent tears the group
// down and makes a new Watchdog for the next attempt.
//
// Time comes from a base::Clock (clock.h): SteadyClock in the agent, a
// ManualClock in the unit tests, which then need no waiting.
//
// Thread safety: the clock's thread only (the agent's io_context).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <sys/types.h>
#include <vector>

#include "base/clock.h"
#include "watchdog/file_timer_server.h"
#include "watchdog/heartbeat_server.h"

namespace ddprun::watchdog {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

struct WatchdogOptions {
  // Longest gap between two beats of one worker; 0 turns heartbeats off.
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

  static constexpr Millis kDefaultGrace{60000};
  Millis effective_grace() const;          // first beat
  Millis effective_silence_grace() const;  // first output
  Millis effective_stuck_timeout() const;
  bool any_enabled() const;
};

enum class HangKind { kHeartbeat, kSilence, kStopped, kUninterruptible, kFileTimer };
const char* to_string(HangKind kind);

// What the watchdog knows about one worker (snapshot for the report).
struct WorkerStatus {
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = 0;
  Clock::time_point spawned{};
  uint64_t beats = 0;
  Clock::time_point last_beat{};  // valid when beats > 0
  std::chrono::system_clock::time_point last_beat_wall{};
  int64_t step = -1;      // step of the last beat
  int64_t max_step = -1;  // highest step seen
  Clock::time_point last_output{};
  bool any_output = false;
  char proc_state = '?';
  std::optional<Clock::time_point> stuck_since;
  bool exited = false;
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
};

class Watchdog {
 public:
  using HangHandler = std::function<void(const HangEvent&)>;

  // `clock` must outlive the watchdog.
  Watchdog(base::Clock& clock, WatchdogOptions options, HangHandler on_hang);
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // A worker was spawned; its deadlines start now.
  void add_worker(int local_rank, int global_rank, pid_t pid);
  void on_beat(const Beat& beat);
  void on_output(int local_rank);
  // An exited worker is no longer watched (a finished peer is not a hang).
  void on_worker_exit(int local_rank);
  void on_file_timer_expiry(const FileTimerExpiry& expiry);
  // Disarms every detector (the attempt is ending for another reason).
  void stop();

  bool fired() const { return fired_; }
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

 private:
  WorkerStatus* find_local(int local_rank);
  std::optional<Clock::time_point> heartbeat_due(const WorkerStatus& w) const;
  std::optional<Clock::time_point> silence_due(const WorkerStatus& w) const;
  std::optional<Clock::time_point> next_due() const;
  void arm_deadline();
  void on_deadline();
  void poll_proc();
  void schedule_poll();
  void fire(HangEvent event);
  // A timer due at `due` fired at `now`; true when that late means the
  // agent was paused (deadlines then restart from `now`).
  bool agent_was_paused(Clock::time_point due, Clock::time_point now);

  base::Clock& clock_;
  WatchdogOptions options_;
  HangHandler on_hang_;
  std::unique_ptr<base::Timer> deadline_timer_;
  std::optional<Clock::time_point> armed_for_;
  std::unique_ptr<base::Timer> poll_timer_;
  bool polling_ = false;
  std::vector<WorkerStatus> workers_;
  bool fired_ = false;
  bool stopped_ = false;
  // When the agent last resumed from a pause; deadlines start no earlier.
  std::optional<Clock::time_point> resumed_;
  int pauses_ = 0;
  Clock::duration paused_for_{};
};

}  // namespace ddprun::watchdog
