// Watchdog (watchdog.h): workers, beats, output, phases and the
// process-state poll. Deadlines: watchdog_deadlines.cc; protection by
// sections, setups and other nodes: watchdog_protection.cc; blame:
// watchdog_blame.cc.
#include "watchdog/watchdog.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "base/clock.h"
#include "base/proc_stat.h"
#include "watchdog/proc.h"

namespace ddprun::watchdog {

using base::in_seconds;

std::string step_text(const WorkerStatus& w) {
  return w.step >= 0 ? fmt::format("last step {}", w.step) : std::string("no step reported");
}

Millis WatchdogOptions::effective_grace() const {
  const Millis grace = heartbeat_grace.count() > 0 ? heartbeat_grace : kDefaultGrace;
  return std::max(grace, heartbeat_timeout);
}

Millis WatchdogOptions::effective_silence_grace() const {
  const Millis grace = heartbeat_grace.count() > 0 ? heartbeat_grace : kDefaultGrace;
  return std::max(grace, silence_timeout);
}

Millis WatchdogOptions::effective_stuck_timeout() const {
  if (stuck_timeout) return *stuck_timeout;
  return heartbeat_timeout.count() > 0 ? heartbeat_timeout : silence_timeout;
}

bool WatchdogOptions::any_enabled() const {
  return heartbeat_timeout.count() > 0 || silence_timeout.count() > 0 ||
         effective_stuck_timeout().count() > 0;
}

const char* to_string(HangKind kind) {
  switch (kind) {
    case HangKind::kHeartbeat: return "heartbeat_timeout";
    case HangKind::kSilence: return "silence_timeout";
    case HangKind::kStopped: return "process_stopped";
    case HangKind::kUninterruptible: return "uninterruptible_sleep";
    case HangKind::kFileTimer: return "torch_file_timer";
    case HangKind::kSection: return "section_timeout";
  }
  return "unknown";
}

HangEvent HangEvent::about(const WorkerStatus& w, HangKind kind, Millis timeout,
                           Clock::time_point due, Clock::time_point detected, std::string detail) {
  HangEvent e;
  e.kind = kind;
  e.local_rank = w.local_rank;
  e.global_rank = w.global_rank;
  e.pid = w.pid;
  e.timeout = timeout;
  e.due = due;
  e.detected = detected;
  e.detail = std::move(detail);
  return e;
}

Watchdog::Watchdog(base::Clock& clock, WatchdogOptions options, HangHandler on_hang,
                   TimeoutLearner* learner)
    : clock_(clock),
      options_(options),
      on_hang_(std::move(on_hang)),
      learner_(learner),
      deadline_timer_(clock.make_timer()),
      poll_timer_(clock.make_timer()) {}

void Watchdog::add_worker(int local_rank, int global_rank, pid_t pid) {
  WorkerStatus w;
  w.local_rank = local_rank;
  w.global_rank = global_rank;
  w.pid = pid;
  w.spawned = clock_.now();
  w.last_output = w.spawned;
  workers_.push_back(w);
  tell_guards();  // in setup: the other nodes' ranks wait for it too
  if (disarmed()) return;
  arm_deadline();
  schedule_poll();
}

void Watchdog::set_global_rank(int local_rank, int global_rank) {
  if (WorkerStatus* w = find_local(local_rank)) w->global_rank = global_rank;
}

WorkerStatus* Watchdog::find_local(int local_rank) {
  for (auto& w : workers_) {
    if (w.local_rank == local_rank) return &w;
  }
  return nullptr;
}

const WorkerStatus* Watchdog::find_local_const(int local_rank) const {
  for (const auto& w : workers_)
    if (w.local_rank == local_rank) return &w;
  return nullptr;
}

void Watchdog::on_beat(const Beat& beat) {
  for (auto& w : workers_) {
    if (w.global_rank != beat.global_rank) continue;
    if (learning()) {
      on_progress(w, beat);
      return;
    }
    // Fixed timeout: every datagram of the rank's shows it alive.
    // A replacement's first beat ends the survivors' wait for it: they
    // re-formed with it meanwhile (no step), and their next beat comes
    // after the step they redo with it, a full timeout from now, not from
    // the replacement's spawn (a recovery longer than the timeout would
    // blame a survivor).
    if (w.beats == 0 && w.local_rank == joining_local_rank_) resumed_ = beat.received;
    ++w.beats;
    if (phase_ == Phase::kReported) resume_after_report(beat.received);
    w.last_beat = beat.received;
    w.last_beat_wall = std::chrono::system_clock::now();
    if (beat.step >= 0 || beat.kind == BeatKind::kExplicit) w.step = beat.step;
    w.max_step = std::max(w.max_step, beat.step);
    // Usually the deadline only moves later and the armed timer re-checks
    // itself when it fires. The first beat can move it EARLIER (grace longer
    // than the timeout), so re-arm then; and after a reported hang no timer
    // is armed at all, so this beat starts the watching again.
    const bool earlier = armed_for_ && options_.heartbeat_timeout.count() > 0 &&
                         beat.received + options_.heartbeat_timeout < *armed_for_;
    if ((earlier || !armed_for_) && !disarmed()) arm_deadline();
    return;
  }
  spdlog::debug("heartbeat from rank {} which has no worker on this agent", beat.global_rank);
}

void Watchdog::on_progress(WorkerStatus& w, const Beat& beat) {
  const auto now = beat.received;
  expire_peer_guards(now);
  const bool was_protected = protected_now();
  switch (beat.kind) {
    case BeatKind::kSectionStart:
      w.sections.emplace_back(beat.section, now);
      w.last_beat = std::max(w.last_beat, now);
      break;
    case BeatKind::kSectionEnd: {
      // The innermost open section of that name; an unmatched end is ignored.
      for (auto it = w.sections.rbegin(); it != w.sections.rend(); ++it) {
        if (it->first != beat.section) continue;
        if (learner_->add(beat.section, now - it->second)) {
          spdlog::warn("more than {} section names: \"{}\" and later new ones share the timeout of \"{}\"",
                       TimeoutLearner::kMaxNamedKinds, beat.section, TimeoutLearner::kOther);
        }
        w.sections.erase(std::next(it).base());
        break;
      }
      w.last_beat = std::max(w.last_beat, now);
      break;
    }
    case BeatKind::kExplicit:
    case BeatKind::kAuto:
    case BeatKind::kForward: {
      if (w.beats == 0) {
        learner_->add(TimeoutLearner::kSetup, now - w.spawned);
        if (w.unwatched) spdlog::info("rank {} sent its first beat: freeze detection is on for it",
                                      w.global_rank);
        w.unwatched = false;
      } else if (w.epoch == epoch_ && !was_protected && w.sections.empty()) {
        // A step's duration only when no rank's section or setup lay in
        // between (those are learned as their own kinds).
        learner_->add(TimeoutLearner::kStep, now - w.last_beat);
      }
      ++w.beats;
      w.last_beat = now;
      w.last_beat_wall = std::chrono::system_clock::now();
      if (beat.kind != BeatKind::kForward) {
        w.step = beat.step;
        w.max_step = std::max(w.max_step, beat.step);
      }
      if (phase_ == Phase::kReported) resume_after_report(now);
      break;
    }
  }
  if (was_protected != protected_now()) protection_changed(now);
  w.epoch = epoch_;
  tell_guards();
  // A timeout learned from the first samples can be far shorter than the
  // initial one the armed timer was set for: re-arm (only ever earlier).
  if (!disarmed()) arm_deadline();
}

void Watchdog::resume_after_report(Clock::time_point now) {
  phase_ = Phase::kWatching;
  // The peers that waited for the stalled rank get a full timeout from now,
  // as after a pause of the agent's.
  resumed_ = now;
  ++epoch_;
}

void Watchdog::rearm_after_report() {
  if (phase_ == Phase::kStopped) return;  // the attempt ended during the report
  phase_ = Phase::kReported;
  ++epoch_;  // the reported stall is no step duration to learn from
  for (auto& w : workers_) w.stuck_since.reset();
  arm_deadline();
  schedule_poll();
}

void Watchdog::on_output(int local_rank) {
  auto* w = find_local(local_rank);
  if (w == nullptr) return;
  const bool first = !w->any_output;
  w->last_output = clock_.now();
  w->any_output = true;
  if (phase_ == Phase::kReported && options_.silence_timeout.count() > 0) {
    resume_after_report(w->last_output);  // output resumed after a reported hang
    arm_deadline();
  }
  // The first output ends the start-up grace, which may move the silence
  // deadline EARLIER than the armed timer: re-arm then (as for a first beat).
  const bool earlier = first && armed_for_ && options_.silence_timeout.count() > 0 &&
                       w->last_output + options_.silence_timeout < *armed_for_;
  if (earlier && !disarmed()) arm_deadline();
}

void Watchdog::on_worker_exit(int local_rank) {
  auto* w = find_local(local_rank);
  if (!w) return;
  const bool was_protected = protected_now();
  w->exited = true;
  // A finished rank's open section or setup no longer excuses its peers.
  if (learning() && was_protected != protected_now()) {
    protection_changed(clock_.now());
    if (!disarmed()) arm_deadline();
  }
  tell_guards();
}

void Watchdog::replace_worker(int local_rank, pid_t pid) {
  WorkerStatus* w = find_local(local_rank);
  if (!w) return;
  const auto now = clock_.now();
  const bool was_protected = protected_now();
  WorkerStatus fresh;
  fresh.local_rank = w->local_rank;
  fresh.global_rank = w->global_rank;
  fresh.pid = pid;
  fresh.spawned = now;
  fresh.last_output = now;
  *w = fresh;
  joining_local_rank_ = local_rank;
  for (auto& other : workers_) other.stuck_since.reset();
  // The survivors' last beats are from before the failure: a full timeout
  // from now, as after a pause of the agent's.
  resumed_ = now;
  phase_ = Phase::kWatching;
  ++epoch_;  // the gap across the recovery is no step duration
  if (learning() && was_protected != protected_now()) protection_changed(now);
  tell_guards();
  disarm_deadline();
  arm_deadline();
  schedule_poll();
}

void Watchdog::peer_replacing() {
  const auto now = clock_.now();
  peer_joining_since_ = now;
  for (auto& w : workers_) w.stuck_since.reset();
  resumed_ = now;
  ++epoch_;  // the gap across the recovery is no step duration
  if (disarmed()) return;  // already acting on a hang of its own
  disarm_deadline();
  arm_deadline();
}

void Watchdog::withdraw() {
  if (phase_ != Phase::kFired) return;
  phase_ = Phase::kWatching;
  resumed_ = clock_.now();
  ++epoch_;  // the stall is no step duration to learn from
  for (auto& w : workers_) w.stuck_since.reset();
  arm_deadline();
  schedule_poll();
}

void Watchdog::on_file_timer_expiry(const FileTimerExpiry& expiry) {
  if (disarmed()) return;
  // torch's client reports os.getpid(): the worker itself or a process it
  // started (a dataloader, a shell's child).
  const WorkerStatus* match = nullptr;
  for (const auto& w : workers_) {
    if (!w.exited && is_same_or_descendant(expiry.pid, w.pid)) match = &w;
  }
  const std::string scope = expiry.scopes.empty() ? "?" : expiry.scopes.front();
  if (match == nullptr) {
    spdlog::warn("torch file timer '{}' expired for pid {}, which is not one of this agent's "
                 "workers; ignored",
                 scope, expiry.pid);
    return;
  }
  const auto now = clock_.now();
  HangEvent e = HangEvent::about(
      *match, HangKind::kFileTimer, Millis(0), now, now,
      fmt::format("torch FileTimer scope '{}' of pid {} expired (torchrun would send it signal {}); {}",
                  scope, expiry.pid, expiry.signal, step_text(*match)));
  e.pid = expiry.pid;
  fire(std::move(e));
}

void Watchdog::stop() {
  phase_ = Phase::kStopped;
  disarm_deadline();
  poll_timer_->cancel();
}

void Watchdog::schedule_poll() {
  if (poll_timer_->armed() || options_.effective_stuck_timeout().count() <= 0) return;
  const auto due = clock_.now() + options_.proc_poll_interval;
  poll_timer_->arm(due, [this, due] {
    // Deadlines restart from the resume; the heartbeat timer, due later,
    // is re-armed from them.
    if (!disarmed() && agent_was_paused(due, clock_.now())) {
      disarm_deadline();
      arm_deadline();
    }
    poll_proc();
  });
}

void Watchdog::poll_proc() {
  if (disarmed()) return;
  const auto now = clock_.now();
  const auto limit = options_.effective_stuck_timeout();
  for (auto& w : workers_) {
    if (w.exited) continue;
    auto st = base::read_proc_stat(w.pid);
    if (!st) continue;  // exiting; the agent will report the exit
    w.proc_state = st->state;
    const bool stuck = st->state == 'T' || st->state == 't' || st->state == 'D';
    if (!stuck) {
      w.stuck_since.reset();
      continue;
    }
    if (!w.stuck_since) w.stuck_since = now;
    if (now - *w.stuck_since >= limit && phase_ != Phase::kReported) {
      const bool uninterruptible = st->state == 'D';
      fire(HangEvent::about(
          w, uninterruptible ? HangKind::kUninterruptible : HangKind::kStopped, limit,
          *w.stuck_since + limit, now,
          fmt::format("process state {} ({}) for {:.2f} s", st->state,
                      uninterruptible ? "uninterruptible sleep" : "stopped",
                      in_seconds(now - *w.stuck_since))));
      return;
    }
  }
  schedule_poll();
}

void Watchdog::fire(HangEvent event) {
  phase_ = Phase::kFired;
  disarm_deadline();
  // No poll pending any more: rearm_after_report() starts a new one.
  poll_timer_->cancel();
  // The owner prints the one warning, naming the culprit (culprit()).
  spdlog::debug("deadline passed on rank {} (pid {}): {}: {}", event.global_rank, event.pid,
                to_string(event.kind), event.detail);
  auto handler = on_hang_;  // the handler may destroy this watchdog
  handler(event);
}

int64_t Watchdog::max_step() const {
  int64_t m = -1;
  for (const auto& w : workers_) m = std::max(m, w.max_step);
  return m;
}

bool Watchdog::judged_by_beats(const WorkerStatus& w) const {
  return !w.exited && (w.beats > 0 || !options_.beats_optional);
}

}  // namespace ddprun::watchdog
