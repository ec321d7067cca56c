// HangReport: what the watchdog saw when an attempt hung, written to the
// attempt's log directory as hang_report.json (for tools) and
// hang_report.txt (for people), plus a one-paragraph summary for the
// agent's failure summary.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "base/queued_writer.h"
#include "base/safe_file.h"
#include "watchdog/evidence.h"
#include "watchdog/stack_capture.h"
#include "watchdog/watchdog.h"

namespace ddprun::watchdog {

struct HangReport {
  int attempt = 0;
  HangEvent event;
  WatchdogOptions options;
  std::vector<WorkerStatus> workers;
  // Global ranks past a deadline at detection (the event's rank first).
  std::vector<int> stalled;
  // Laggard rule: ranks whose step is behind their peers'.
  std::vector<int> suspects;
  std::vector<StackCapture> stacks;
  // The one rank blamed, named first in the headline, the warning and the
  // JSON (culprit_rank, first of suspect_ranks): Watchdog::culprit() at
  // detection, replaced by the stacks' verdict when native stacks show it
  // before the headline is printed (culprit_by_stacks).
  int culprit = -1;
  bool culprit_by_stacks = false;
  // What the stacks alone say stopped first: a rank whose stack is outside
  // every collective while others' wait inside one (they are its victims),
  // the earliest last beat first; -1 when they cannot tell. Python
  // tracebacks arrive after the headline: then shown, never re-blamed.
  int stack_culprit = -1;
  // Learned mode: every timeout and what it was learned from.
  std::vector<LearnedTimeout> timeouts;
  // What ddprun does about it: "restart", "exit" or "report".
  std::string action;
  // Ranks whose captured stack waits inside a collective.
  std::vector<int> in_collective;
  // What each rank's Python stack waits in ("all_reduce", "backward (DDP's
  // gradient all-reduce)"), by rank; ranks outside any are absent.
  std::vector<std::pair<int, std::string>> collectives;
  // Every rank waits in a collective, not all in the same one: who called
  // what, where (find_culprit); empty otherwise.
  std::string mismatch;
  // What the culprit was seen doing (evidence.h or the stacks), which sets
  // the advice: a spinning rank, a deadlock, a blocked write, ...
  CulpritState culprit_state = CulpritState::kNone;
  // The evidence rule's clause when it ended the stall (evidence.h).
  std::string evidence;
  // Where the worker logs are, by global rank (may be empty).
  std::vector<std::pair<int, std::string>> worker_logs;
  // Fields a writer adds beside the agent's, merged at the top level of
  // to_json() (`ddprun attach`: source, attach_kind, watched,
  // report_after_due_ms; docs/hang_report.schema.json lists them).
  nlohmann::json extra = nlohmann::json::object();

  // Sets stack_culprit and in_collective from stacks and workers; with
  // `may_blame`, a stack verdict also becomes the culprit.
  void find_culprit(bool may_blame = true);
  // What to do next, fitted to what was seen: where the culprit is for a
  // spinning rank, a deadlock or a blocked write; the flag to change when
  // the stall may be legitimate.
  std::vector<std::string> advice() const;
  // The culprit's main-thread Python frames (innermost first), for the
  // console; empty without a Python stack of it.
  std::string culprit_frames(std::size_t max = 8) const;
  nlohmann::json to_json() const;
  std::string to_text() const;
  // One paragraph: rank, kind, detail, suspects, where the report is.
  std::string summary(const std::string& report_dir = "") const;
  // Writes <dir>/hang_report.json and <dir>/hang_report.txt; throws
  // WatchdogError naming the file on failure.
  void write(const std::string& dir) const;
  // The same into a folder already opened (`ddprun attach` opens
  // --report-dir once, at its start).
  void write(const base::SafeDir& folder) const;
  // The agent's way: rendered now, written whole (write_atomically, through
  // SafeDir) on `writer`'s thread after what was queued there before, so
  // the loop never waits for the log folder; a failure is the writer's
  // on_error line.
  void write_later(base::QueuedWriter& writer, const std::string& dir) const;
};

// True when a stack (native frames or a Python traceback) waits inside a
// collective: all_reduce, barrier, broadcast, all_gather, ... in torch,
// Gloo, NCCL or our own communicators.
bool stack_in_collective(const std::string& stack_text);
// The main thread's part of a native stack capture (eu-stack's or gdb's
// layout; the main thread's id is `pid`); the whole text when it has no
// thread structure or the thread is not found.
std::string main_thread_stack(const std::string& stack_text, pid_t pid);

// Snapshot of `dog` for `event` (stacks and logs are filled in by the caller).
HangReport make_hang_report(const Watchdog& dog, const HangEvent& event, int attempt);

}  // namespace ddprun::watchdog
