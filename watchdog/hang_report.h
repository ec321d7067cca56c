// HangReport: what the watchdog saw when an attempt hung, written to the
// attempt's log directory as hang_report.json (for tools) and
// hang_report.txt (for people), plus a one-paragraph summary for the
// agent's failure summary.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

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
  // The rank that stopped first, by stacks and beats: a rank whose stack is
  // outside every collective while other ranks' stacks wait inside one (they
  // are its victims); the earliest last beat first. -1 when the stacks
  // cannot tell (none captured, or none inside a collective).
  int culprit = -1;
  // Ranks whose captured stack waits inside a collective.
  std::vector<int> in_collective;
  // Where the worker logs are, by global rank (may be empty).
  std::vector<std::pair<int, std::string>> worker_logs;

  // Sets culprit and in_collective from stacks and workers.
  void find_culprit();
  // Flags the user may want to change, with why.
  std::vector<std::string> advice() const;
  nlohmann::json to_json() const;
  std::string to_text() const;
  // One paragraph: rank, kind, detail, suspects, where the report is.
  std::string summary(const std::string& report_dir = "") const;
  // Writes <dir>/hang_report.json and <dir>/hang_report.txt; throws
  // WatchdogError naming the file on failure.
  void write(const std::string& dir) const;
};

// True when a stack (native frames or a Python traceback) waits inside a
// collective: all_reduce, barrier, broadcast, all_gather, ... in torch,
// Gloo, NCCL or our own communicators.
bool stack_in_collective(const std::string& stack_text);

// Snapshot of `dog` for `event` (stacks and logs are filled in by the caller).
HangReport make_hang_report(const Watchdog& dog, const HangEvent& event, int attempt);

}  // namespace ddprun::watchdog
