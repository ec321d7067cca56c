// EventLog: the job's history as JSON lines (events.jsonl in the log
// directory) so a user or a dashboard can follow a job after the fact.
//
// Each line: {"event": "start|rendezvous|worker_exit|hang_detected|restart|done|
//   log_write_failed|..." (and the monitor's straggler, straggler_recovered
//   and progress, every rank's step: introspect/agent_hook.h),
//   "time": ISO 8601 UTC wall clock, "monotonic_s": steady clock seconds,
//   "attempt": N, "ranks": [global ranks], "reason": "...", ...extra fields}
// Lines are queued to a writer thread (base/queued_writer.h), which appends
// each batch of whole lines with one write(2) on an O_APPEND descriptor, so
// the loop never waits for the log folder (NFS) and a reader never sees half
// a line. Past the writer's bound lines are dropped, and once the file has
// caught up one line {"event": "events_dropped", "bytes": N, ...} says so.
// The file is created with 64 KiB reserved (fallocate, its length unchanged)
// so worker logs that fill the disk leave room for some 250 events.
//
// Thread safety: not thread-safe (the agent's loop thread writes).
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/queued_writer.h"

namespace ddprun::watchdog {

// The writer the watchdog's files share (events.jsonl, the hang reports):
// its failures are logged; at exit it waits up to 2 s for them.
std::shared_ptr<base::QueuedWriter> make_watchdog_writer();

class EventLog {
 public:
  // Opens (creating, appending) `path`; throws WatchdogError naming it.
  // `writer` writes it (shared with the hang reports); null: one of its own
  // (make_watchdog_writer()).
  explicit EventLog(std::string path, std::shared_ptr<base::QueuedWriter> writer = nullptr);
  ~EventLog();
  EventLog(EventLog&& other) noexcept;
  EventLog& operator=(EventLog&&) = delete;
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  // Appends one event; `extra` fields are merged in. A failed write is
  // logged, not thrown: the job matters more than its history.
  void write(const std::string& event, int attempt, const std::vector<int>& ranks,
             const std::string& reason, const nlohmann::json& extra = nlohmann::json::object());

  const std::string& path() const { return path_; }
  // Sees every event as it is written (the file may fail; the tap still
  // sees it): the job's counters (hangs, culprits) for `ddprun status` and
  // the metrics exporter, without a second channel beside the log. Called
  // on the writing (loop) thread; it must not block. Empty: none.
  using Tap = std::function<void(const nlohmann::json& event)>;
  void set_tap(Tap tap) { tap_ = std::move(tap); }
  // Also log every line on ddprun's stderr (--event-log-handler=console).
  void echo_to_console(bool on) { echo_ = on; }
  // Waits up to `deadline` until the lines written so far are in the file.
  bool flush(std::chrono::steady_clock::time_point deadline) { return writer_->flush(deadline); }

 private:
  std::string path_;
  bool echo_ = false;
  bool said_failed_ = false;
  Tap tap_;
  std::shared_ptr<base::QueuedWriter> writer_;
  base::QueuedFile file_;
};

}  // namespace ddprun::watchdog
