#include "watchdog/event_log.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>

#include "base/safe_file.h"
#include "base/version.h"
#include "watchdog/error.h"

namespace ddprun::watchdog {

namespace {

std::string now_iso8601() {
  const auto now = std::chrono::system_clock::now();
  const auto secs = std::chrono::system_clock::to_time_t(now);
  const auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()) % 1000000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:06d}Z", buf, static_cast<int>(us.count()));
}

}  // namespace

EventLog::EventLog(std::string path) : path_(std::move(path)) {
  // By the folder's descriptor, never through a planted symlink or hard link
  // (base/safe_file.h): the agent may be root in a user-writable log folder.
  const size_t slash = path_.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path_.substr(0, std::max<size_t>(slash, 1));
  try {
    fd_ = base::SafeDir::open(dir).open_append(path_.substr(slash + 1));
  } catch (const base::FileError& e) {
    throw WatchdogError(e.what());
  }
}

EventLog::~EventLog() = default;

EventLog::EventLog(EventLog&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::move(other.fd_)) {}

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
  std::size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_.get(), line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      spdlog::warn("event log {}: write failed: {}", path_, std::strerror(errno));
      return;
    }
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace ddprun::watchdog
