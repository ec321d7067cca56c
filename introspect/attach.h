// `ddprun attach`: the hang watchdog for processes ddprun did not start (a
// torchrun, srun or mpirun job). Its detectors are the agent's
// (watchdog::Watchdog on a base::Clock, through AttachWatch:
// attach_watch.h) fed with what is visible from outside:
//  - progress: a watched process's CPU time (utime+stime) or I/O byte
//    counters (rchar+wchar, pipes and sockets included) moved; none for
//    silence_timeout is a hang (the Watchdog's silence detector);
//  - state: stopped (T/t) or in uninterruptible sleep (D) continuously for
//    stuck_timeout;
//  - --watch-file: a log file that has not grown or been touched for
//    silence_timeout (the whole job hangs, not one rank);
//  - heartbeats: with heartbeat_socket, attach binds that AF_UNIX datagram
//    socket; workers started with DDPRUN_HEARTBEAT_SOCKET set to it beat
//    through ddprun's heartbeat modules (beats sent before attach started
//    are dropped by the clients). A rank that has beaten and then stays
//    silent for heartbeat_timeout is hung; ranks never heard from are not
//    judged by this rule.
// What is watched: each given process's tree is scanned every poll; the
// processes in it with RANK in their environment are the ranks (torchrun's
// workers); a tree without any is watched through its root. New ranks (a
// launcher's restart) join, ended ones leave.
// On a hang: one report on stdout and, with report_dir, the agent's
// hang_report.{json,txt} (watchdog::HangReport: the culprit rule, one
// schema, docs/hang_report.schema.json), every rank's stacks, the hung one
// first (stacks.h); then on_hang: nothing (keep watching, from the next
// progress of any rank, as the agent's --on-hang=report), kill (SIGTERM to
// every process of the trees, SIGKILL after kill_grace, so the job's own
// launcher, if it is outside the trees, can restart it), or command (run
// through /bin/sh with DDPRUN_HANG_RANK, DDPRUN_HANG_PID and
// DDPRUN_HANG_REPORT set, bounded by command_timeout).
//
// Polling /proc is the only way to see processes we are not the parent of;
// every wait is bounded. The stack capture and the actions block the loop
// (bounded by their tools' limits): attach has nothing else to serve.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "introspect/slurm_step.h"
#include "introspect/stacks.h"

namespace ddprun::introspect {

// `ddprun attach --on-hang`: what attach does after a hang's report. Not
// the agent's OnHang (agent/options.h): attach cannot restart a job it did
// not start.
enum class AttachOnHang { kNothing, kKill, kCommand };

struct AttachOptions {
  // Roots of the watched trees (at least one of pids, pgid, slurm_step).
  std::vector<pid_t> pids;
  // Every process of this process group is a root.
  pid_t pgid = 0;
  // The topmost processes of this Slurm step on this node are roots
  // (slurm_step.h), found again at every poll.
  std::optional<SlurmStep> slurm_step;
  // No CPU and no I/O progress for this long is a hang.
  std::chrono::milliseconds silence_timeout{60000};
  // State T or D for this long is a hang; unset: silence_timeout; 0: off.
  std::optional<std::chrono::milliseconds> stuck_timeout;
  // Files that must keep growing (or being touched) within silence_timeout.
  std::vector<std::string> watch_files;
  // Heartbeat socket path to bind (empty: no heartbeats) and the longest
  // gap between two beats of a rank.
  std::string heartbeat_socket;
  std::chrono::milliseconds heartbeat_timeout{60000};
  // How often /proc is sampled (detection comes at most this late).
  std::chrono::milliseconds poll_interval{200};
  AttachOnHang on_hang = AttachOnHang::kNothing;
  std::string command;  // for kCommand
  std::chrono::milliseconds command_timeout{60000};
  // SIGTERM-to-SIGKILL grace of kKill.
  std::chrono::milliseconds kill_grace{10000};
  // Where hang_report.{txt,json} go; empty: stdout only.
  std::string report_dir;
  CollectOptions stacks;
  // Stop after the first hang whatever on_hang says (tests, scripts).
  bool once = false;
};

// run_attach's results, `ddprun attach`'s exit status (2 is a usage error).
inline constexpr int kAttachEnded = 0;  // the processes ended without a hang
inline constexpr int kAttachHang = 1;   // a hang was reported
// A hang was reported (stdout) and handled, but its hang_report.{json,txt}
// could not be written in report_dir (one line said why).
inline constexpr int kAttachReportUnwritten = 3;

// Watches until every watched process has ended (or, with kill or once, the
// first hang was handled). Throws std::invalid_argument naming a pid or
// group that does not exist, a report_dir attach may not write into
// (base::SafeDir's rules) or a heartbeat socket it cannot bind.
int run_attach(const AttachOptions& options, std::ostream& out);

}  // namespace ddprun::introspect
