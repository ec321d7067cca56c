#include "introspect/attach_watch.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "base/clock.h"
#include "base/proc_stat.h"
#include "introspect/proc_usage.h"
#include "introspect/slurm_step.h"

namespace ddprun::introspect {

namespace {


// The agent's detectors with attach's limits: progress is CPU or I/O
// (on_output), beats count only from a rank's first one.
watchdog::WatchdogOptions rank_options(const AttachOptions& o) {
  watchdog::WatchdogOptions w;
  w.silence_timeout = o.silence_timeout;
  // A rank is judged from when attach first saw it, with no start-up grace
  // beyond the timeout itself: it may have run for hours already.
  w.heartbeat_grace = o.silence_timeout;
  w.heartbeat_timeout = o.heartbeat_socket.empty() ? watchdog::Millis{0} : o.heartbeat_timeout;
  w.beats_optional = true;
  w.stuck_timeout = o.stuck_timeout.value_or(o.silence_timeout);
  w.proc_poll_interval = o.poll_interval;
  return w;
}

watchdog::WatchdogOptions file_options(const AttachOptions& o) {
  watchdog::WatchdogOptions w;
  w.silence_timeout = o.silence_timeout;
  w.heartbeat_grace = o.silence_timeout;
  w.stuck_timeout = watchdog::Millis{0};  // a file has no process state
  return w;
}

}  // namespace

std::vector<pid_t> attach_roots(const AttachOptions& o) {
  std::vector<pid_t> roots = o.pids;
  if (o.pgid > 0)
    for (pid_t p : group_members(o.pgid)) roots.push_back(p);
  if (o.slurm_step)
    for (pid_t p : slurm_step_roots(*o.slurm_step)) roots.push_back(p);
  return roots;
}

AttachWatch::File AttachWatch::stat_file(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return {path, -1, {}};  // not (yet) there
  return {path, st.st_size, st.st_mtim};
}

AttachWatch::AttachWatch(base::Clock& clock, const AttachOptions& options,
                         std::function<void(const Hang&)> on_hang, std::function<void()> on_ended)
    : clock_(clock),
      options_(options),
      on_hang_(std::move(on_hang)),
      on_ended_(std::move(on_ended)),
      dog_(clock, rank_options(options),
           [this](const watchdog::HangEvent& e) { on_dog_hang(e, false); }),
      files_dog_(clock, file_options(options),
                 [this](const watchdog::HangEvent& e) { on_dog_hang(e, true); }),
      sample_timer_(clock.make_timer()) {}

void AttachWatch::start() {
  for (const auto& path : options_.watch_files) {
    files_dog_.add_worker(static_cast<int>(files_.size()), -1, 0);
    files_.push_back(stat_file(path));
  }
  sample();
}

void AttachWatch::on_beat(const watchdog::Beat& beat) {
  if (ended_) return;
  // A rank that started after the last sample (a restart, or a job started
  // just before attach) is unknown until the next one, and the Watchdog
  // drops beats of unknown ranks: its last beat before a hang would be lost
  // and the rank could not be blamed. Sample now instead, at most once a
  // poll interval (a process writing to the socket that is no rank cannot
  // make attach scan /proc per datagram).
  const bool known = std::any_of(ranks_.begin(), ranks_.end(),
                                 [&](const auto& r) { return r.second.rank == beat.global_rank; });
  if (!known && (!last_unknown_scan_ || clock_.now() - *last_unknown_scan_ >= options_.poll_interval)) {
    last_unknown_scan_ = clock_.now();
    sample();
    if (ended_) return;
  }
  dog_.on_beat(beat);
}

void AttachWatch::sample() {
  if (ended_) return;
  const auto found = find_ranks(attach_roots(options_));
  for (auto it = ranks_.begin(); it != ranks_.end();) {
    if (found.count(it->first)) {
      ++it;
      continue;
    }
    dog_.on_worker_exit(it->second.index);  // ended: a finished rank is no hang
    it = ranks_.erase(it);
  }
  if (found.empty()) {
    ended_ = true;
    dog_.stop();
    files_dog_.stop();
    on_ended_();
    return;
  }
  for (const auto& [pid, rank] : found) {
    const auto u = read_proc_usage(pid);
    if (!u) continue;  // exiting: gone at the next sample
    auto [it, fresh] = ranks_.try_emplace(pid);
    Rank& r = it->second;
    if (!fresh && r.rank != rank) {
      // First seen between fork and exec (the parent's environ, no RANK
      // yet): its rank is known only now, and its beats would never match
      // without it (a loaded run of introspect.attach saw none).
      r.rank = rank;
      dog_.set_global_rank(r.index, rank);
      if (auto st = base::read_proc_stat(pid)) r.comm = st->comm;
    }
    if (fresh) {
      r.index = next_index_++;
      r.rank = rank;
      r.pid = pid;
      if (auto st = base::read_proc_stat(pid)) r.comm = st->comm;
      dog_.add_worker(r.index, rank, pid);
    } else if (u->cpu_ticks != r.ticks || u->io_bytes != r.io) {
      dog_.on_output(r.index);
    }
    r.ticks = u->cpu_ticks;
    r.io = u->io_bytes;
    r.state = u->state;
  }
  for (std::size_t i = 0; i < files_.size(); ++i) {
    File now = stat_file(files_[i].path);
    const File& was = files_[i];
    if (now.size != was.size || now.mtime.tv_sec != was.mtime.tv_sec ||
        now.mtime.tv_nsec != was.mtime.tv_nsec)
      files_dog_.on_output(static_cast<int>(i));
    files_[i] = std::move(now);
  }
  sample_timer_->arm(clock_.now() + options_.poll_interval, [this] { sample(); });
}

base::TimePoint AttachWatch::last_progress(const Rank& rank) const {
  for (const auto& w : dog_.workers())
    if (w.local_rank == rank.index) return w.last_output;
  return clock_.now();
}

void AttachWatch::on_dog_hang(const watchdog::HangEvent& event, bool from_file) {
  Hang h{event, "", from_file};
  auto& e = h.event;
  if (from_file) {
    // The file's worker: rank -1, the whole job.
    const auto i = static_cast<std::size_t>(e.local_rank);
    h.attach_kind = "watch_file";
    e.detail = fmt::format("{} has not changed for {:.1f} s", files_.at(i).path,
                           base::in_seconds(e.detected - files_dog_.workers().at(i).last_output));
    e.local_rank = -1;
  } else if (e.kind == watchdog::HangKind::kSilence) {
    // The Watchdog's "output" is attach's CPU and I/O progress.
    h.attach_kind = "no_progress";
    if (const auto it = ranks_.find(e.pid); it != ranks_.end())
      e.detail = fmt::format("no CPU time and no I/O for {:.1f} s (state {})",
                             base::in_seconds(e.detected - last_progress(it->second)), it->second.state);
  } else {
    h.attach_kind = watchdog::to_string(e.kind);
  }
  on_hang_(h);
}

watchdog::HangReport AttachWatch::report(const Hang& hang) const {
  watchdog::HangReport r = watchdog::make_hang_report(dog_, hang.event, 0);
  r.event.local_rank = -1;
  for (auto& w : r.workers) {
    for (const auto& [pid, rank] : ranks_)
      if (rank.index == w.local_rank && w.proc_state == '?') w.proc_state = rank.state;
    w.local_rank = -1;  // not known from outside
  }
  return r;
}

void AttachWatch::rearm(const Hang& hang) {
  if (ended_) return;
  (hang.from_file ? files_dog_ : dog_).rearm_after_report();
}

}  // namespace ddprun::introspect
