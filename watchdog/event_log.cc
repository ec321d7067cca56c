#include "watchdog/event_log.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <fcntl.h>

#include <algorithm>
#include <chrono>
#include <ctime>

#include "base/safe_file.h"
#include "base/system_error.h"
#include "base/utc_time.h"
#include "base/version.h"
#include "watchdog/error.h"

namespace ddprun::watchdog {

namespace {

std::string now_iso8601() { return base::utc_iso8601(std::chrono::system_clock::now(), 6); }

}  // namespace

std::shared_ptr<base::QueuedWriter> make_watchdog_writer() {
  base::QueuedWriter::Options o;
  o.close_wait = std::chrono::milliseconds(2000);
  o.on_error = [](const std::string& what) { spdlog::warn("{}", what); };
  return std::make_shared<base::QueuedWriter>(std::move(o));
}

EventLog::EventLog(std::string path, std::shared_ptr<base::QueuedWriter> writer)
    : path_(std::move(path)), writer_(std::move(writer)) {
  // By the folder's descriptor, never through a planted symlink or hard link
  // (base/safe_file.h): the agent may be root in a user-writable log folder.
  const size_t slash = path_.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path_.substr(0, std::max<size_t>(slash, 1));
  base::ScopedFd fd;
  try {
    fd = base::SafeDir::open(dir).open_append(path_.substr(slash + 1));
  } catch (const base::FileError& e) {
    throw WatchdogError(e.what());
  }
  // Room reserved for the job's history before any worker writes a byte:
  // the writer threads race, and worker logs filling the disk must not
  // take events.jsonl's first page (its log_write_failed line above all).
  // KEEP_SIZE: the file's length stays its content. Best effort: a file
  // system without fallocate (NFS before 4.2) just has no reserve.
  constexpr off_t kReserved = 64 * 1024;
  (void)::fallocate(fd.get(), FALLOC_FL_KEEP_SIZE, 0, kReserved);
  if (!writer_) writer_ = make_watchdog_writer();
  // The gap a stalled folder left, as an event of its own: the file stays
  // JSON lines.
  file_ = writer_->add(std::move(fd), path_, [path = path_](size_t dropped) {
    const nlohmann::json j = {{"event", "events_dropped"},
                              {"time", now_iso8601()},
                              {"bytes", dropped},
                              {"reason", base::QueuedWriter::drop_notice(dropped, path)},
                              {"ddprun_version", base::version()}};
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  });
}

EventLog::~EventLog() = default;

EventLog::EventLog(EventLog&& other) noexcept
    : path_(std::move(other.path_)),
      echo_(other.echo_),
      said_failed_(other.said_failed_),
      tap_(std::move(other.tap_)),
      writer_(std::move(other.writer_)),
      file_(std::move(other.file_)) {}

void EventLog::write(const std::string& event, int attempt, const std::vector<int>& ranks,
                     const std::string& reason, const nlohmann::json& extra) {
  nlohmann::json j = {
      {"event", event},
      {"time", now_iso8601()},
      {"monotonic_s", std::chrono::duration<double>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count()},
      {"attempt", attempt},
      {"ranks", ranks},
      {"reason", reason},
      // Every line: logs of several nodes or runs, merged, still say which build wrote each.
      {"ddprun_version", base::version()},
  };
  if (extra.is_object()) j.update(extra);
  std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (echo_) spdlog::info("event: {}", line.substr(0, line.size() - 1));
  if (tap_) tap_(j);
  if (const int err = file_.error()) {
    if (!said_failed_) spdlog::warn("event log {}: write failed: {}", path_, base::errno_text(err));
    said_failed_ = true;
    return;
  }
  file_.write(line);
}

}  // namespace ddprun::watchdog
