// EventLog: the job's history as JSON lines (events.jsonl in the log
// directory) so a user or a dashboard can follow a job after the fact.
//
// Each line: {"event": "start|rendezvous|worker_exit|hang_detected|restart|done|
//   log_write_failed",
//   "time": ISO 8601 UTC wall clock, "monotonic_s": steady clock seconds,
//   "attempt": N, "ranks": [global ranks], "reason": "...", ...extra fields}
// Lines are appended with one write(2) on an O_APPEND descriptor, so a
// reader never sees half a line.
//
// Thread safety: not thread-safe (the agent's loop thread writes).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "base/scoped_fd.h"

namespace ddprun::watchdog {

class EventLog {
 public:
  // Opens (creating, appending) `path`; throws WatchdogError naming it.
  explicit EventLog(std::string path);
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
  // Also log every line on ddprun's stderr (--event-log-handler=console).
  void echo_to_console(bool on) { echo_ = on; }

 private:
  std::string path_;
  bool echo_ = false;
  base::ScopedFd fd_;
};

}  // namespace ddprun::watchdog
