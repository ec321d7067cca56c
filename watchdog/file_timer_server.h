// FileTimerServer: torch's file-based watchdog protocol, served on the
// agent's io_context exactly as torchrun's FileTimerServer
// (torch/distributed/elastic/timer/file_based_local_timer.py) does when the
// agent runs with TORCHELASTIC_ENABLE_FILE_TIMER=1.
//
// Protocol: the server creates a FIFO at TORCHELASTIC_TIMER_FILE. Each
// FileTimerClient request opens it O_WRONLY|O_NONBLOCK, writes one JSON line
// (<= PIPE_BUF, so atomic) and closes it:
//   {"version": 1, "pid": 123, "scope_id": "s", "expiration_time": 1.7e9,
//    "signal": 9}
// expiration_time is wall-clock seconds (time.time()); a negative value
// releases the timer (pid, scope_id). A timer is keyed by (pid, scope_id).
// When timers of a pid expire, torchrun sends the first (by expiration) of
// their signals that is > 0 to the pid and clears all the pid's timers; a pid
// whose expired timers all carry signal <= 0 is only logged (and cleared).
// We differ only in the action: instead of killing the pid, the expiry is
// handed to a callback (the watchdog reports a hang and the agent restarts
// the whole group, which torchrun would only do after the kill).
//
// Deadlines use a steady_timer set to the earliest expiry, so an expiry is
// seen within milliseconds rather than torchrun's polling interval.
//
// Thread safety: io_context thread only.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <sys/types.h>
#include <utility>
#include <vector>

#include "base/liveness.h"
#include "base/scoped_fd.h"

namespace ddprun::watchdog {

struct FileTimerRequest {
  int version = 1;
  pid_t pid = 0;
  std::string scope_id;
  // Wall-clock seconds since the epoch; negative means release.
  double expiration_time = 0;
  int signal = 0;
};

// Parses one JSON request line; nullopt (and `error` set) when malformed.
std::optional<FileTimerRequest> parse_file_timer_request(std::string_view line,
                                                         std::string* error);

struct FileTimerExpiry {
  pid_t pid = 0;
  // Every expired scope of this pid, earliest first.
  std::vector<std::string> scopes;
  // The signal torchrun would have sent (first expired timer with signal > 0).
  int signal = 0;
  double expiration_time = 0;
};

class FileTimerServer {
 public:
  using ExpiryHandler = std::function<void(const FileTimerExpiry&)>;

  // Creates the FIFO at `path` (removing an existing file, as torch does)
  // and starts reading. Throws WatchdogError on failure.
  FileTimerServer(boost::asio::io_context& io, std::string path, ExpiryHandler on_expiry);
  // Stops reading and removes the FIFO.
  ~FileTimerServer();
  FileTimerServer(const FileTimerServer&) = delete;
  FileTimerServer& operator=(const FileTimerServer&) = delete;

  const std::string& path() const { return path_; }
  std::size_t active_timers() const { return timers_.size(); }
  uint64_t requests_received() const { return requests_; }

 private:
  void read();
  void on_bytes(std::size_t n);
  void handle_line(std::string_view line);
  void arm();
  void on_timer();

  std::string path_;
  ExpiryHandler on_expiry_;
  boost::asio::posix::stream_descriptor reader_;
  // Held open so the FIFO never reports EOF between clients (which would
  // make the reader readable forever: a busy loop).
  base::ScopedFd keepalive_writer_;
  boost::asio::steady_timer timer_;
  char buf_[4096];
  std::string partial_;
  std::map<std::pair<pid_t, std::string>, FileTimerRequest> timers_;
  uint64_t requests_ = 0;
  // False once destroyed: queued completions must not touch `this`.
  base::Liveness alive_;
};

}  // namespace ddprun::watchdog
