#include "watchdog/watchdog.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "base/proc_stat.h"
#include "watchdog/proc.h"

namespace ddprun::watchdog {

namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string step_text(const WorkerStatus& w) {
  return w.step >= 0 ? fmt::format("last step {}", w.step) : std::string("no step reported");
}

}  // namespace

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
  if (fired_ || stopped_) return;
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
    // after the step they redo with it, a full timeout from now. (From its
    // spawn instead, a recovery longer than the timeout on a loaded machine
    // blamed a survivor at the replacement's first beat: a second failure.)
    if (w.beats == 0 && w.local_rank == joining_local_rank_) resumed_ = beat.received;
    ++w.beats;
    if (waiting_for_beat_) resume_after_report(beat.received);
    w.last_beat = beat.received;
    w.last_beat_wall = std::chrono::system_clock::now();
    if (beat.step >= 0 || beat.kind == BeatKind::kExplicit) w.step = beat.step;
    w.max_step = std::max(w.max_step, beat.step);
    // Usually the deadline only moves later and the armed timer re-checks
    // itself when it fires. The first beat can move it EARLIER (grace longer
    // than the timeout), so re-arm then.
    const bool earlier = armed_for_ && options_.heartbeat_timeout.count() > 0 &&
                         beat.received + options_.heartbeat_timeout < *armed_for_;
    // No timer at all after a reported hang (--on-hang=report): this beat
    // starts the watching again.
    if ((earlier || !armed_for_) && !fired_ && !stopped_) {
      arm_deadline();
    }
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
      if (waiting_for_beat_) resume_after_report(now);
      break;
    }
  }
  if (was_protected != protected_now()) protection_changed(now);
  w.epoch = epoch_;
  tell_guards();
  // A timeout learned from the first samples can be far shorter than the
  // initial one the armed timer was set for: re-arm (only ever earlier).
  if (!fired_ && !stopped_) arm_deadline();
}

bool Watchdog::protected_now() const {
  for (const auto& w : workers_) {
    if (w.exited) continue;
    if (!w.sections.empty()) return true;
    if (w.beats == 0 && !w.unwatched) return true;
  }
  // Another node's rank in a section or setup: ranks here wait for it in
  // the next collective as they would for a local one.
  return !peer_guards_.empty();
}

std::vector<Guard> Watchdog::guards() const {
  std::vector<Guard> out;
  if (!learning()) return out;
  for (const auto& w : workers_) {
    if (w.exited) continue;
    Guard g;
    g.rank = w.global_rank;
    if (!w.sections.empty()) {
      g.section = w.sections.back().first;  // the innermost is the one judged
      g.until = w.sections.back().second + learner_->timeout(g.section);
    } else if (w.beats == 0 && !w.unwatched) {
      g.section = TimeoutLearner::kSetup;
      g.until = w.spawned + learner_->timeout(TimeoutLearner::kSetup);
    } else {
      continue;
    }
    out.push_back(std::move(g));
  }
  return out;
}

void Watchdog::on_guards_changed(std::function<void(const std::vector<Guard>&)> f) {
  on_guards_changed_ = std::move(f);
  told_guards_ = guards();
  if (on_guards_changed_) on_guards_changed_(told_guards_);
}

void Watchdog::tell_guards() {
  if (!on_guards_changed_) return;
  auto now = guards();
  if (now == told_guards_) return;
  told_guards_ = std::move(now);
  on_guards_changed_(told_guards_);
}

void Watchdog::on_peer_guards(int node, std::vector<Guard> guards) {
  if (!learning() || stopped_) return;
  const auto now = clock_.now();
  const bool was_protected = protected_now();
  guards.erase(std::remove_if(guards.begin(), guards.end(),
                              [&](const Guard& g) { return g.until <= now; }),
               guards.end());
  for (auto& g : guards) g.node = node;
  if (guards.empty()) {
    peer_guards_.erase(node);
  } else {
    peer_guards_[node] = std::move(guards);
  }
  expire_peer_guards(now);
  if (was_protected != protected_now()) protection_changed(now);
  if (!fired_) arm_deadline();  // a guard's end is a wake-up (next_due)
}

void Watchdog::expire_peer_guards(Clock::time_point now) {
  const bool was_protected = protected_now();
  for (auto it = peer_guards_.begin(); it != peer_guards_.end();) {
    auto& list = it->second;
    list.erase(std::remove_if(list.begin(), list.end(),
                              [&](const Guard& g) { return g.until <= now; }),
               list.end());
    it = list.empty() ? peer_guards_.erase(it) : std::next(it);
  }
  if (was_protected != protected_now()) protection_changed(now);
}

std::vector<Guard> Watchdog::peer_guards() const {
  std::vector<Guard> out;
  for (const auto& [node, list] : peer_guards_) out.insert(out.end(), list.begin(), list.end());
  return out;
}

void Watchdog::protection_changed(Clock::time_point now) {
  ++epoch_;
  if (!protected_now()) protection_ended_ = now;
}

void Watchdog::resume_after_report(Clock::time_point now) {
  waiting_for_beat_ = false;
  // The peers that waited for the stalled rank get a full timeout from now,
  // as after a pause of the agent's.
  resumed_ = now;
  ++epoch_;
}

void Watchdog::rearm_after_report() {
  fired_ = false;
  waiting_for_beat_ = true;
  ++epoch_;  // the reported stall is no step duration to learn from
  for (auto& w : workers_) w.stuck_since.reset();
  arm_deadline();
  schedule_poll();
}

void Watchdog::on_output(int local_rank) {
  if (auto* w = find_local(local_rank)) {
    const bool first = !w->any_output;
    w->last_output = clock_.now();
    w->any_output = true;
    if (waiting_for_beat_ && options_.silence_timeout.count() > 0) {
      resume_after_report(w->last_output);  // output resumed after a reported hang
      if (!fired_ && !stopped_) arm_deadline();
    }
    // The first output ends the start-up grace, which may move the silence
    // deadline EARLIER than the armed timer: re-arm then (as for a first beat).
    const bool earlier = first && armed_for_ && options_.silence_timeout.count() > 0 &&
                         w->last_output + options_.silence_timeout < *armed_for_;
    if (earlier && !fired_ && !stopped_) arm_deadline();
  }
}

void Watchdog::on_worker_exit(int local_rank) {
  auto* w = find_local(local_rank);
  if (!w) return;
  const bool was_protected = protected_now();
  w->exited = true;
  // A finished rank's open section or setup no longer excuses its peers.
  if (learning() && was_protected != protected_now()) {
    protection_changed(clock_.now());
    if (!fired_ && !stopped_) arm_deadline();
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
  waiting_for_beat_ = false;
  fired_ = false;
  stopped_ = false;
  ++epoch_;  // the gap across the recovery is no step duration
  if (learning() && was_protected != protected_now()) protection_changed(now);
  tell_guards();
  armed_for_.reset();
  deadline_timer_->cancel();
  arm_deadline();
  schedule_poll();
}

void Watchdog::peer_replacing() {
  const auto now = clock_.now();
  peer_joining_since_ = now;
  for (auto& w : workers_) w.stuck_since.reset();
  resumed_ = now;
  ++epoch_;  // the gap across the recovery is no step duration
  if (fired_ || stopped_) return;  // already acting on a hang of its own
  armed_for_.reset();
  deadline_timer_->cancel();
  arm_deadline();
}

void Watchdog::blame(int local_rank, int peer_node, std::string detail) {
  if (fired_ || stopped_) return;
  const WorkerStatus* w = find_local(local_rank);
  if (w == nullptr || w->exited) return;
  HangEvent e;
  e.kind = HangKind::kHeartbeat;
  e.local_rank = w->local_rank;
  e.global_rank = w->global_rank;
  e.pid = w->pid;
  e.due = clock_.now();
  e.detected = e.due;
  e.detail = std::move(detail);
  e.peer_node = peer_node;
  fire(std::move(e));
}

void Watchdog::withdraw() {
  if (!fired_ || stopped_) return;
  fired_ = false;
  const auto now = clock_.now();
  resumed_ = now;
  ++epoch_;  // the stall is no step duration to learn from
  for (auto& w : workers_) w.stuck_since.reset();
  arm_deadline();
  schedule_poll();
}

void Watchdog::on_file_timer_expiry(const FileTimerExpiry& expiry) {
  if (fired_ || stopped_) return;
  // torch's client reports os.getpid(): the worker itself or a process it
  // started (a dataloader, a shell's child).
  const WorkerStatus* match = nullptr;
  for (const auto& w : workers_) {
    if (!w.exited && is_same_or_descendant(expiry.pid, w.pid)) match = &w;
  }
  HangEvent e;
  e.kind = HangKind::kFileTimer;
  e.pid = expiry.pid;
  e.due = clock_.now();
  e.detected = e.due;
  const std::string scope = expiry.scopes.empty() ? "?" : expiry.scopes.front();
  if (match == nullptr) {
    spdlog::warn("torch file timer '{}' expired for pid {}, which is not one of this agent's "
                 "workers; ignored",
                 scope, expiry.pid);
    return;
  }
  e.local_rank = match->local_rank;
  e.global_rank = match->global_rank;
  e.detail = fmt::format("torch FileTimer scope '{}' of pid {} expired (torchrun would send it "
                         "signal {}); {}",
                         scope, expiry.pid, expiry.signal, step_text(*match));
  fire(std::move(e));
}

void Watchdog::stop() {
  stopped_ = true;
  deadline_timer_->cancel();
  poll_timer_->cancel();
  armed_for_.reset();
  polling_ = false;
}

int64_t Watchdog::max_step() const {
  int64_t m = -1;
  for (const auto& w : workers_) m = std::max(m, w.max_step);
  return m;
}

std::optional<Watchdog::LearnedDue> Watchdog::learned_deadline(const WorkerStatus& w) const {
  if (!learning() || w.exited || waiting_for_beat_) return std::nullopt;
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

void Watchdog::ask_judge(HangEvent event) {
  judging_ = true;
  ++judgements_;
  const auto from = event.stall_from;
  judge_(event, [this, event = std::move(event), from](bool hung, std::string why) mutable {
    judging_ = false;
    if (fired_ || stopped_) return;
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
    if (alive_stalls_.size() >= 64) alive_stalls_.erase(alive_stalls_.begin());
    alive_stalls_.push_back(from);
    const auto full = learner_->explain(event.kind == HangKind::kSection ? event.section
                                                                      : std::string(TimeoutLearner::kStep));
    // Once an attempt on the console: a job with many long pauses would
    // otherwise say it at each.
    spdlog::log(said_alive_ ? spdlog::level::debug : spdlog::level::info,
                "freeze: no progress for {:.1f} s, past the learned bound of {:.1f} s, but {}: "
                "waiting up to the full timeout ({}){}",
                seconds(clock_.now() - from), seconds(event.timeout), why, full.describe(),
                said_alive_ ? "" : "; said once");
    said_alive_ = true;
    arm_deadline();
  });
}

bool Watchdog::any_exited() const {
  for (const auto& w : workers_)
    if (w.exited) return true;
  return false;
}

Clock::time_point Watchdog::latest_progress() const {
  Clock::time_point latest{};
  for (const auto& w : workers_)
    if (!w.exited && w.beats > 0) latest = std::max(latest, w.last_beat);
  return latest;
}

std::optional<Clock::time_point> Watchdog::setup_due(const WorkerStatus& w) const {
  if (!learning() || w.exited || w.beats > 0 || w.unwatched) return std::nullopt;
  return w.spawned + learner_->timeout(TimeoutLearner::kSetup);
}

bool Watchdog::judged_by_beats(const WorkerStatus& w) const {
  return !w.exited && (w.beats > 0 || !options_.beats_optional);
}

std::optional<Clock::time_point> Watchdog::heartbeat_due(const WorkerStatus& w) const {
  if (learning()) return learned_due(w);
  if (options_.heartbeat_timeout.count() <= 0 || !judged_by_beats(w) || waiting_for_beat_)
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
  if (options_.silence_timeout.count() <= 0 || w.exited || waiting_for_beat_) return std::nullopt;
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
               seconds(late));
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

void Watchdog::on_deadline() {
  const auto armed = armed_for_;
  armed_for_.reset();
  if (fired_ || stopped_) return;
  const auto now = clock_.now();
  if (armed && agent_was_paused(*armed, now)) {
    arm_deadline();
    return;
  }
  expire_peer_guards(now);
  // Setups that passed without a beat: not a hang (the program may never
  // beat), but said once, and no longer an excuse for the other ranks.
  std::vector<int> unwatched;
  const bool was_protected = protected_now();
  for (auto& w : workers_) {
    if (auto due = setup_due(w); due && *due <= now) {
      w.unwatched = true;
      unwatched.push_back(w.global_rank);
    }
  }
  if (!unwatched.empty()) {
    if (was_protected != protected_now()) protection_changed(now);
    if (on_unwatched_) on_unwatched_(unwatched, learner_->timeout(TimeoutLearner::kSetup));
    tell_guards();
  }
  // The overdue deadline that passed first names the hang.
  std::optional<HangEvent> first;
  bool first_kind_progress = false;
  Clock::time_point first_last_beat{};
  for (const auto& w : workers_) {
    // Progress deadlines are the node's: the rank whose own last progress
    // is oldest names the event.
    const auto learned = learned_deadline(w);
    if (auto due = learned ? std::optional<Clock::time_point>(learned->due) : std::nullopt;
        learning() && due && *due <= now &&
        (!first || *due < first->due ||
         (*due == first->due && first_kind_progress && w.sections.empty() &&
          w.last_beat < first_last_beat))) {
      first_kind_progress = w.sections.empty();
      first_last_beat = w.last_beat;
      HangEvent e;
      e.due = *due;
      e.local_rank = w.local_rank;
      e.global_rank = w.global_rank;
      e.pid = w.pid;
      if (!w.sections.empty()) {
        const auto& [name, start] = w.sections.back();
        const auto t = learner_->explain(name);
        e.kind = HangKind::kSection;
        e.section = name;
        e.timeout = learned->by_evidence ? learner_->evidence_bound(name) : t.timeout;
        e.by_evidence = learned->by_evidence;
        e.stall_from = learned->from;
        e.learned_from = t.describe();
        e.detail = learned->by_evidence
                       ? fmt::format("inside section \"{}\" for {:.2f} s, past its learned bound of "
                                     "{:.2f} s ({}, floor included; {})",
                                     name, seconds(now - start), seconds(e.timeout), t.describe(),
                                     step_text(w))
                       : fmt::format("inside section \"{}\" for {:.2f} s, past its timeout ({}; {})",
                                     name, seconds(now - start), t.describe(), step_text(w));
      } else {
        const auto t = learner_->explain(TimeoutLearner::kStep);
        e.kind = HangKind::kHeartbeat;
        e.timeout = learned->by_evidence ? learner_->evidence_bound() : t.timeout;
        e.by_evidence = learned->by_evidence;
        e.stall_from = learned->from;
        e.learned_from = t.describe();
        e.detail = learned->by_evidence
                       ? fmt::format("no progress for {:.2f} s, past the learned bound of {:.2f} s "
                                     "({}; learned {}, floor included)",
                                     seconds(now - w.last_beat), seconds(e.timeout), step_text(w),
                                     t.describe())
                       : fmt::format("no progress for {:.2f} s ({}; learned {})",
                                     seconds(now - w.last_beat), step_text(w), t.describe());
      }
      first = e;
      continue;
    }
    if (auto due = heartbeat_due(w); due && *due <= now && (!first || *due < first->due)) {
      HangEvent e;
      e.kind = HangKind::kHeartbeat;
      e.timeout = w.beats == 0 ? options_.effective_grace() : options_.heartbeat_timeout;
      e.due = *due;
      e.detail = w.beats == 0
                     ? fmt::format("no first heartbeat within the {:.2f} s grace after start",
                                   seconds(e.timeout))
                     : fmt::format("no heartbeat for {:.2f} s ({})", seconds(now - w.last_beat),
                                   step_text(w));
      e.local_rank = w.local_rank;
      e.global_rank = w.global_rank;
      e.pid = w.pid;
      first = e;
    }
    if (auto due = silence_due(w); due && *due <= now && (!first || *due < first->due)) {
      HangEvent e;
      e.kind = HangKind::kSilence;
      e.timeout = w.any_output ? options_.silence_timeout : options_.effective_silence_grace();
      e.due = *due;
      e.detail = w.any_output ? fmt::format("no output on stdout or stderr for {:.2f} s",
                                            seconds(now - w.last_output))
                              : fmt::format("no first output within the {:.2f} s grace after start",
                                            seconds(e.timeout));
      e.local_rank = w.local_rank;
      e.global_rank = w.global_rank;
      e.pid = w.pid;
      first = e;
    }
  }
  if (first) {
    first->detected = now;
    if (first->by_evidence) {
      ask_judge(std::move(*first));
      return arm_deadline();
    }
    fire(std::move(*first));
    return;
  }
  arm_deadline();
}

void Watchdog::schedule_poll() {
  if (polling_ || options_.effective_stuck_timeout().count() <= 0) return;
  polling_ = true;
  const auto due = clock_.now() + options_.proc_poll_interval;
  poll_timer_->arm(due, [this, due] {
    polling_ = false;
    // Deadlines restart from the resume; the heartbeat timer, due later,
    // is re-armed from them.
    if (!fired_ && !stopped_ && agent_was_paused(due, clock_.now())) {
      armed_for_.reset();
      deadline_timer_->cancel();
      arm_deadline();
    }
    poll_proc();
  });
}

void Watchdog::poll_proc() {
  if (fired_ || stopped_) return;
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
    if (now - *w.stuck_since >= limit && !waiting_for_beat_) {
      HangEvent e;
      e.kind = st->state == 'D' ? HangKind::kUninterruptible : HangKind::kStopped;
      e.timeout = limit;
      e.due = *w.stuck_since + limit;
      e.detected = now;
      e.detail = fmt::format("process state {} ({}) for {:.2f} s", st->state,
                             st->state == 'D' ? "uninterruptible sleep" : "stopped",
                             seconds(now - *w.stuck_since));
      e.local_rank = w.local_rank;
      e.global_rank = w.global_rank;
      e.pid = w.pid;
      fire(std::move(e));
      return;
    }
  }
  schedule_poll();
}

void Watchdog::fire(HangEvent event) {
  fired_ = true;
  deadline_timer_->cancel();
  poll_timer_->cancel();
  // No poll pending any more: rearm_after_report() must be able to start one.
  polling_ = false;
  armed_for_.reset();
  // The owner prints the one warning, naming the culprit (culprit()).
  spdlog::debug("deadline passed on rank {} (pid {}): {}: {}", event.global_rank, event.pid,
                to_string(event.kind), event.detail);
  auto handler = on_hang_;  // the handler may destroy this watchdog
  handler(event);
}

std::vector<int> Watchdog::stalled_ranks(const HangEvent& event) const {
  std::vector<int> out{event.global_rank};
  for (const auto& w : workers_) {
    if (w.global_rank == event.global_rank || w.exited) continue;
    bool overdue = false;
    if (auto d = heartbeat_due(w); d && *d <= event.detected) overdue = true;
    if (auto d = silence_due(w); d && *d <= event.detected) overdue = true;
    if (w.stuck_since) overdue = true;
    if (overdue) out.push_back(w.global_rank);
  }
  return out;
}

int Watchdog::culprit(const HangEvent& event) const {
  // Only a missed beat is judged by comparing ranks; the other kinds are
  // about the rank's own state (a section, its output, its process state).
  if (event.kind != HangKind::kHeartbeat) return event.global_rank;
  int64_t furthest = -1;
  for (const auto& w : workers_)
    if (judged_by_beats(w)) furthest = std::max(furthest, w.step);
  const WorkerStatus* behind = nullptr;
  for (const auto& w : workers_)
    if (judged_by_beats(w) && furthest >= 0 && w.step < furthest && (!behind || w.step < behind->step))
      behind = &w;
  if (behind) return behind->global_rank;
  // Same step everywhere: a live rank that never beat held the others up;
  // else the one whose last progress is oldest stopped first.
  const WorkerStatus* oldest = nullptr;
  for (const auto& w : workers_) {
    if (!judged_by_beats(w)) continue;
    if (w.beats == 0) return w.global_rank;
    if (!oldest || w.last_beat < oldest->last_beat) oldest = &w;
  }
  return oldest ? oldest->global_rank : event.global_rank;
}

std::vector<int> Watchdog::suspects(const HangEvent& event) const {
  int64_t furthest = -1;
  for (const auto& w : workers_) {
    if (judged_by_beats(w)) furthest = std::max(furthest, w.step);
  }
  std::vector<const WorkerStatus*> behind;
  for (const auto& w : workers_) {
    if (judged_by_beats(w) && furthest >= 0 && w.step < furthest) behind.push_back(&w);
  }
  if (behind.empty()) return stalled_ranks(event);
  std::sort(behind.begin(), behind.end(),
            [](const auto* a, const auto* b) { return a->step < b->step; });
  std::vector<int> out;
  for (const auto* w : behind) out.push_back(w->global_rank);
  return out;
}

}  // namespace ddprun::watchdog
