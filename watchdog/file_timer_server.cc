#include "watchdog/file_timer_server.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <nlohmann/json.hpp>

#include "watchdog/error.h"

namespace ddprun::watchdog {

namespace asio = boost::asio;

std::optional<FileTimerRequest> parse_file_timer_request(std::string_view line,
                                                         std::string* error) {
  try {
    const auto j = nlohmann::json::parse(line);
    FileTimerRequest r;
    // torch reads exactly these keys; "version" is written but not checked.
    r.version = j.value("version", 1);
    r.pid = j.at("pid").get<pid_t>();
    r.scope_id = j.at("scope_id").get<std::string>();
    r.expiration_time = j.at("expiration_time").get<double>();
    r.signal = j.at("signal").get<int>();
    return r;
  } catch (const std::exception& e) {
    if (error) *error = e.what();
    return std::nullopt;
  }
}

FileTimerServer::FileTimerServer(asio::io_context& io, std::string path, ExpiryHandler on_expiry)
    : path_(std::move(path)), on_expiry_(std::move(on_expiry)), reader_(io), timer_(io) {
  ::unlink(path_.c_str());
  if (::mkfifo(path_.c_str(), 0600) != 0) throw sys_error("mkfifo", path_, errno);
  // Non-blocking read end first (a blocking open would wait for a writer).
  base::ScopedFd rfd(::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!rfd) {
    const int err = errno;
    ::unlink(path_.c_str());
    throw sys_error("open", path_, err);
  }
  keepalive_writer_.reset(::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
  if (!keepalive_writer_) {
    const int err = errno;
    ::unlink(path_.c_str());
    throw sys_error("open", path_, err);
  }
  reader_.assign(rfd.release());
  read();
}

FileTimerServer::~FileTimerServer() {
  alive_.revoke();
  boost::system::error_code ec;
  timer_.cancel();
  reader_.close(ec);
  keepalive_writer_.reset();
  ::unlink(path_.c_str());
}

void FileTimerServer::read() {
  reader_.async_read_some(asio::buffer(buf_), [this, alive = alive_.token()](
                                                  const boost::system::error_code& ec,
                                                  std::size_t n) {
    if (!alive || ec == asio::error::operation_aborted) return;
    if (ec) {
      spdlog::error("timer file {}: read failed: {}; torch file timers are no longer served",
                    path_, ec.message());
      return;
    }
    on_bytes(n);
    read();
  });
}

void FileTimerServer::on_bytes(std::size_t n) {
  partial_.append(buf_, n);
  std::size_t start = 0;
  for (std::size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
    handle_line(std::string_view(partial_).substr(start, nl - start));
  }
  partial_.erase(0, start);
  // A line longer than PIPE_BUF cannot come from FileTimerClient.
  if (partial_.size() > 65536) partial_.clear();
  arm();
}

void FileTimerServer::handle_line(std::string_view line) {
  if (line.empty()) return;
  std::string error;
  auto req = parse_file_timer_request(line, &error);
  if (!req) {
    spdlog::warn("timer file {}: dropped malformed request ({}): {}", path_, error,
                 std::string(line.substr(0, 200)));
    return;
  }
  ++requests_;
  auto key = std::make_pair(req->pid, req->scope_id);
  if (req->expiration_time < 0) {
    timers_.erase(key);
  } else {
    timers_[key] = std::move(*req);
  }
}

void FileTimerServer::arm() {
  if (timers_.empty()) {
    timer_.cancel();
    return;
  }
  double earliest = timers_.begin()->second.expiration_time;
  for (const auto& [key, t] : timers_) earliest = std::min(earliest, t.expiration_time);
  // Wall-clock expiry mapped onto the steady clock once, at arming time.
  const double now_wall =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const auto delay = std::chrono::duration<double>(std::max(0.0, earliest - now_wall));
  timer_.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(delay));
  timer_.async_wait([this, alive = alive_.token()](const boost::system::error_code& ec) {
    if (!ec && alive) on_timer();
  });
}

void FileTimerServer::on_timer() {
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::map<pid_t, std::vector<FileTimerRequest>> expired;
  for (const auto& [key, t] : timers_) {
    if (t.expiration_time <= now) expired[t.pid].push_back(t);
  }
  std::vector<FileTimerExpiry> events;
  for (auto& [pid, list] : expired) {
    std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) {
      return a.expiration_time < b.expiration_time;
    });
    FileTimerExpiry e;
    e.pid = pid;
    e.expiration_time = list.front().expiration_time;
    for (const auto& t : list) {
      e.scopes.push_back(t.scope_id);
      if (e.signal <= 0 && t.signal > 0) e.signal = t.signal;
    }
    // Like torchrun: every timer of a reaped pid is cleared.
    for (auto it = timers_.begin(); it != timers_.end();) {
      it = it->first.first == pid ? timers_.erase(it) : std::next(it);
    }
    if (e.signal <= 0) {
      spdlog::info("torch file timer expired for pid {} (scope {}) with no signal; torchrun "
                   "does not reap it, neither do we",
                   pid, e.scopes.front());
      continue;
    }
    events.push_back(std::move(e));
  }
  arm();
  // Callbacks last, through a copy: a handler may tear this server down.
  auto handler = on_expiry_;
  for (const auto& e : events) handler(e);
}

}  // namespace ddprun::watchdog
