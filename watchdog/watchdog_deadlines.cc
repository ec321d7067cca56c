// Watchdog's deadlines (watchdog.h): each detector's due time, the one
// timer set to the earliest, and the event of the first deadline passed.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "base/clock.h"
#include "watchdog/watchdog.h"

namespace ddprun::watchdog {

using base::in_seconds;

namespace {

// At most this many alive verdicts are remembered; the oldest go first.
constexpr std::size_t kMaxAliveStalls = 64;

}  // namespace

std::optional<Watchdog::LearnedDue> Watchdog::learned_deadline(const WorkerStatus& w) const {
  if (!learning() || w.exited || phase_ == Phase::kReported) return std::nullopt;
  LearnedDue d;
  Millis limit;
  std::string kind = TimeoutLearner::kStep;
  if (!w.sections.empty()) {
    d.from = w.sections.back().second;
    kind = w.sections.back().first;
    limit = learner_->timeout(kind);
  } else if (w.beats > 0 && !protected_now() && !any_exited()) {
    // (A rank that exited means the job is ending: its peers' teardown,
    // destroy_process_group and interpreter exit, beats no more.)
    // Judged job-wide: a rank waiting in a collective for a peer that still
    // progresses (a longer eval pass, a checkpoint then an eval) is not
    // hung; when one rank freezes, the others stop within a step too.
    d.from = latest_progress();
    if (protection_ended_) d.from = std::max(d.from, *protection_ended_);
    limit = learner_->timeout(TimeoutLearner::kStep);
  } else {
    return std::nullopt;
  }
  // The evidence bound, once per stall: a verdict of alive (or one
  // pending) leaves the full timeout.
  const Millis bound = judge_ && !judging_ ? learner_->evidence_bound(kind) : Millis(0);
  if (bound.count() > 0 &&
      std::find(alive_stalls_.begin(), alive_stalls_.end(), d.from) == alive_stalls_.end()) {
    limit = bound;
    d.by_evidence = true;
  }
  // After a pause of the agent's, a full timeout from the resume.
  if (resumed_) d.from = std::max(d.from, *resumed_);
  d.due = d.from + limit;
  return d;
}

std::optional<Clock::time_point> Watchdog::learned_due(const WorkerStatus& w) const {
  auto d = learned_deadline(w);
  return d ? std::optional<Clock::time_point>(d->due) : std::nullopt;
}

std::optional<Clock::time_point> Watchdog::setup_due(const WorkerStatus& w) const {
  if (!learning() || w.exited || w.beats > 0 || w.unwatched) return std::nullopt;
  return w.spawned + learner_->timeout(TimeoutLearner::kSetup);
}

std::optional<Clock::time_point> Watchdog::heartbeat_due(const WorkerStatus& w) const {
  if (learning()) return learned_due(w);
  if (options_.heartbeat_timeout.count() <= 0 || !judged_by_beats(w) || phase_ == Phase::kReported)
    return std::nullopt;
  auto due = w.beats == 0 ? w.spawned + options_.effective_grace()
                          : w.last_beat + options_.heartbeat_timeout;
  // After a pause of the agent's, a full timeout from the resume.
  if (resumed_) due = std::max(due, *resumed_ + options_.heartbeat_timeout);
  // A survivor waiting for a replacement that is still starting (loading
  // LibTorch, importing torch: seconds on a busy host) is not hung: no
  // deadline before the replacement's own first-beat grace runs out.
  if (const WorkerStatus* joining = find_local_const(joining_local_rank_);
      joining && joining->beats == 0 && !joining->exited)
    due = std::max(due, joining->spawned + options_.effective_grace());
  // ... and so is one waiting for another node's replacement.
  if (peer_joining_since_ && (w.beats == 0 || w.last_beat <= *peer_joining_since_))
    due = std::max(due, *peer_joining_since_ + options_.effective_grace());
  return due;
}

std::optional<Clock::time_point> Watchdog::silence_due(const WorkerStatus& w) const {
  if (options_.silence_timeout.count() <= 0 || w.exited || phase_ == Phase::kReported)
    return std::nullopt;
  // Start-up (import torch, compilation) is quiet, not hung: the timeout
  // arms at the first output; until then the start-up grace applies.
  auto due = w.any_output ? w.last_output + options_.silence_timeout
                          : w.spawned + options_.effective_silence_grace();
  if (resumed_) due = std::max(due, *resumed_ + options_.silence_timeout);
  return due;
}

bool Watchdog::agent_was_paused(Clock::time_point due, Clock::time_point now) {
  const auto late = now - due;
  if (late <= options_.pause_threshold) return false;
  ++pauses_;
  paused_for_ += late;
  resumed_ = now;
  // A worker seen stuck before the pause is watched afresh: the agent did
  // not see how long it stayed so.
  for (auto& w : workers_) {
    if (w.stuck_since) w.stuck_since = now;
  }
  spdlog::warn("this agent did not run for {:.2f} s (stopped, frozen or descheduled); the "
               "workers' deadlines restart now instead of blaming them for that time",
               in_seconds(late));
  return true;
}

std::optional<Clock::time_point> Watchdog::next_due() const {
  std::optional<Clock::time_point> best;
  for (const auto& w : workers_) {
    for (auto due : {heartbeat_due(w), silence_due(w), setup_due(w)}) {
      if (due && (!best || *due < *best)) best = due;
    }
  }
  // A peer node's guard ends by itself when its time passes.
  for (const auto& [node, list] : peer_guards_)
    for (const auto& g : list)
      if (!best || g.until < *best) best = g.until;
  return best;
}

void Watchdog::arm_deadline() {
  const auto due = next_due();
  if (!due) return;
  if (armed_for_ && *armed_for_ <= *due) return;  // already waking up earlier
  armed_for_ = due;
  deadline_timer_->arm(*due, [this] { on_deadline(); });
}

void Watchdog::disarm_deadline() {
  armed_for_.reset();
  deadline_timer_->cancel();
}

void Watchdog::on_deadline() {
  const auto armed = armed_for_;
  armed_for_.reset();
  if (disarmed()) return;
  const auto now = clock_.now();
  if (armed && agent_was_paused(*armed, now)) return arm_deadline();
  expire_peer_guards(now);
  unwatch_passed_setups(now);
  std::optional<HangEvent> first = first_overdue(now);
  if (!first) return arm_deadline();
  if (first->by_evidence) {
    ask_judge(std::move(*first));
    return arm_deadline();
  }
  fire(std::move(*first));
}

void Watchdog::unwatch_passed_setups(Clock::time_point now) {
  // Not a hang (the program may never beat), but said once, and no longer
  // an excuse for the other ranks.
  std::vector<int> unwatched;
  const bool was_protected = protected_now();
  for (auto& w : workers_) {
    if (auto due = setup_due(w); due && *due <= now) {
      w.unwatched = true;
      unwatched.push_back(w.global_rank);
    }
  }
  if (unwatched.empty()) return;
  if (was_protected != protected_now()) protection_changed(now);
  if (on_unwatched_) on_unwatched_(unwatched, learner_->timeout(TimeoutLearner::kSetup));
  tell_guards();
}

std::optional<HangEvent> Watchdog::first_overdue(Clock::time_point now) const {
  std::optional<HangEvent> first;
  // Progress deadlines are the node's, so several ranks share one due
  // time: then the rank whose own last progress is oldest names the event.
  bool first_is_progress = false;
  Clock::time_point first_last_beat{};
  auto earlier = [&](Clock::time_point due) { return !first || due < first->due; };
  for (const auto& w : workers_) {
    if (learning()) {
      const auto learned = learned_deadline(w);
      if (learned && learned->due <= now &&
          (earlier(learned->due) || (learned->due == first->due && first_is_progress &&
                                     w.sections.empty() && w.last_beat < first_last_beat))) {
        first_is_progress = w.sections.empty();
        first_last_beat = w.last_beat;
        first = learned_event(w, *learned, now);
        continue;
      }
    } else if (auto due = heartbeat_due(w); due && *due <= now && earlier(*due)) {
      const bool never_beat = w.beats == 0;
      const Millis timeout = never_beat ? options_.effective_grace() : options_.heartbeat_timeout;
      first = HangEvent::about(
          w, HangKind::kHeartbeat, timeout, *due, now,
          never_beat ? fmt::format("no first heartbeat within the {:.2f} s grace after start",
                                   in_seconds(timeout))
                     : fmt::format("no heartbeat for {:.2f} s ({})", in_seconds(now - w.last_beat),
                                   step_text(w)));
    }
    if (auto due = silence_due(w); due && *due <= now && earlier(*due)) {
      const Millis timeout =
          w.any_output ? options_.silence_timeout : options_.effective_silence_grace();
      first = HangEvent::about(
          w, HangKind::kSilence, timeout, *due, now,
          w.any_output
              ? fmt::format("no output on stdout or stderr for {:.2f} s",
                            in_seconds(now - w.last_output))
              : fmt::format("no first output within the {:.2f} s grace after start",
                            in_seconds(timeout)));
    }
  }
  return first;
}

HangEvent Watchdog::learned_event(const WorkerStatus& w, const LearnedDue& learned,
                                  Clock::time_point now) const {
  HangEvent e;
  if (!w.sections.empty()) {
    const auto& [name, start] = w.sections.back();
    const auto t = learner_->explain(name);
    const Millis timeout = learned.by_evidence ? learner_->evidence_bound(name) : t.timeout;
    e = HangEvent::about(
        w, HangKind::kSection, timeout, learned.due, now,
        learned.by_evidence
            ? fmt::format("inside section \"{}\" for {:.2f} s, past its learned bound of {:.2f} s "
                          "({}, floor included; {})",
                          name, in_seconds(now - start), in_seconds(timeout), t.describe(),
                          step_text(w))
            : fmt::format("inside section \"{}\" for {:.2f} s, past its timeout ({}; {})", name,
                          in_seconds(now - start), t.describe(), step_text(w)));
    e.section = name;
    e.learned_from = t.describe();
  } else {
    const auto t = learner_->explain(TimeoutLearner::kStep);
    const Millis timeout = learned.by_evidence ? learner_->evidence_bound() : t.timeout;
    e = HangEvent::about(
        w, HangKind::kHeartbeat, timeout, learned.due, now,
        learned.by_evidence
            ? fmt::format("no progress for {:.2f} s, past the learned bound of {:.2f} s ({}; "
                          "learned {}, floor included)",
                          in_seconds(now - w.last_beat), in_seconds(timeout), step_text(w),
                          t.describe())
            : fmt::format("no progress for {:.2f} s ({}; learned {})",
                          in_seconds(now - w.last_beat), step_text(w), t.describe()));
    e.learned_from = t.describe();
  }
  e.by_evidence = learned.by_evidence;
  e.stall_from = learned.from;
  return e;
}

void Watchdog::ask_judge(HangEvent event) {
  judging_ = true;
  ++judgements_;
  const auto from = event.stall_from;
  judge_(event, [this, event = std::move(event), from](bool hung, std::string why) mutable {
    judging_ = false;
    if (disarmed()) return;
    // Progress since (a beat moved the stall's start): nothing to act on.
    const WorkerStatus* w = find_local_const(event.local_rank);
    const auto now_d = w ? learned_deadline(*w) : std::nullopt;
    if (!now_d || now_d->from != from) return arm_deadline();
    if (hung) {
      event.detected = clock_.now();
      event.evidence = why;
      event.detail += "; " + why;
      return fire(std::move(event));
    }
    if (alive_stalls_.size() >= kMaxAliveStalls) alive_stalls_.erase(alive_stalls_.begin());
    alive_stalls_.push_back(from);
    const auto full = learner_->explain(event.kind == HangKind::kSection
                                            ? event.section
                                            : std::string(TimeoutLearner::kStep));
    // Once an attempt on the console: a job with many long pauses would
    // otherwise say it at each.
    spdlog::log(said_alive_ ? spdlog::level::debug : spdlog::level::info,
                "freeze: no progress for {:.1f} s, past the learned bound of {:.1f} s, but {}: "
                "waiting up to the full timeout ({}){}",
                in_seconds(clock_.now() - from), in_seconds(event.timeout), why, full.describe(),
                said_alive_ ? "" : "; said once");
    said_alive_ = true;
    arm_deadline();
  });
}

}  // namespace ddprun::watchdog
