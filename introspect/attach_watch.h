// AttachWatch: the hang detection of `ddprun attach`, which is watchdog/'s:
// a watchdog::Watchdog over the watched ranks and a second one over the
// --watch-file logs, both on a base::Clock (SteadyClock in attach, a
// ManualClock in tests), fed from /proc, which is all attach can see of
// processes it did not start:
//  - every poll_interval (a timer on the clock) the ranks in the trees are
//    found again (find_ranks): a new one is the Watchdog's add_worker, an
//    ended one its on_worker_exit;
//  - a rank's CPU time (utime+stime) or I/O bytes (rchar+wchar) that moved
//    are its "output" (on_output), so the Watchdog's silence detector is
//    attach's "no progress for silence_timeout";
//  - state T/t/D for stuck_timeout: the Watchdog's own process-state poll;
//  - beats given to on_beat (attach's heartbeat socket): its fixed heartbeat
//    detector, a rank judged only from its first beat (beats_optional); a
//    beat from a rank not sampled yet samples at once (at most once a
//    poll_interval), so the beat is not lost;
//  - a --watch-file whose size or mtime changed is "output" of that file in
//    the second Watchdog's silence detector (the whole job, rank -1).
// On a hang on_hang gets the event; report() is the agent's HangReport of
// it (make_hang_report: stalled ranks, suspects, the culprit rule). Both
// Watchdogs disarm when they fire, as in the agent; rearm() watches on from
// the next progress (the agent's --on-hang=report).
//
// Thread safety: the clock's thread only.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "introspect/attach.h"
#include "watchdog/hang_report.h"
#include "watchdog/watchdog.h"

namespace ddprun::introspect {

// The roots of the watched trees now (pids, the group's members, the Slurm
// step's topmost processes).
std::vector<pid_t> attach_roots(const AttachOptions& options);

class AttachWatch {
 public:
  struct Hang {
    watchdog::HangEvent event;
    // attach's name for the rule: no_progress, watch_file,
    // heartbeat_timeout, process_stopped, uninterruptible_sleep.
    std::string attach_kind;
    bool from_file = false;
  };
  // One watched rank as last sampled.
  struct Rank {
    int index = 0;  // its local rank in the Watchdog
    int rank = -1;
    pid_t pid = 0;
    std::string comm;
    char state = '?';
    uint64_t ticks = 0;
    std::optional<uint64_t> io;
  };

  // `clock` must outlive the watch. on_ended: every watched process has
  // ended (nothing is watched after it).
  AttachWatch(base::Clock& clock, const AttachOptions& options,
              std::function<void(const Hang&)> on_hang, std::function<void()> on_ended);
  AttachWatch(const AttachWatch&) = delete;
  AttachWatch& operator=(const AttachWatch&) = delete;

  // Samples now, then every poll_interval.
  void start();
  void on_beat(const watchdog::Beat& beat);
  // The agent's report of `hang` (attempt 0, no action, no stacks yet);
  // workers' local ranks are -1 (not known from outside).
  watchdog::HangReport report(const Hang& hang) const;
  // After a reported hang: watching goes on from the next progress.
  void rearm(const Hang& hang);
  // The ranks now, by pid.
  const std::map<pid_t, Rank>& ranks() const { return ranks_; }
  // When `rank` last made progress (CPU, I/O), on the clock.
  base::TimePoint last_progress(const Rank& rank) const;
  const watchdog::Watchdog& watchdog() const { return dog_; }

 private:
  struct File {
    std::string path;
    off_t size = -1;
    timespec mtime{};
  };
  static File stat_file(const std::string& path);
  void sample();
  void on_dog_hang(const watchdog::HangEvent& event, bool from_file);

  base::Clock& clock_;
  const AttachOptions& options_;
  std::function<void(const Hang&)> on_hang_;
  std::function<void()> on_ended_;
  watchdog::Watchdog dog_;
  watchdog::Watchdog files_dog_;
  std::unique_ptr<base::Timer> sample_timer_;
  std::map<pid_t, Rank> ranks_;
  int next_index_ = 0;
  std::vector<File> files_;
  bool ended_ = false;
  std::optional<base::TimePoint> last_unknown_scan_;  // the rate limit in on_beat
};

}  // namespace ddprun::introspect
