// HeartbeatServer: the agent's end of the heartbeat socket.
//
// Binds an AF_UNIX datagram socket, receives beats asynchronously on the
// agent's io_context, parses them (format: heartbeat_wire.h) and hands each
// valid one to a callback. Malformed datagrams are dropped with a warning
// that is rate-limited so a misbehaving worker cannot flood the log.
//
// One server per attempt: a fresh socket means beats queued by the previous
// attempt's (killed) workers are never mistaken for new ones.
//
// Thread safety: not thread-safe; use it from the io_context's thread only.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/datagram_protocol.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "base/contract.h"
#include "base/liveness.h"

namespace ddprun::watchdog {

// What one datagram said (heartbeat_wire.h).
enum class BeatKind { kExplicit, kAuto, kForward, kSectionStart, kSectionEnd };

// Field order keeps {rank, step, received} initializers valid.
struct Beat {
  int64_t global_rank = 0;
  // -1 when the worker reported no step (always for kForward and sections).
  int64_t step = -1;
  std::chrono::steady_clock::time_point received;
  BeatKind kind = BeatKind::kExplicit;
  // kSectionStart / kSectionEnd: the section's name; empty otherwise.
  std::string section;
};

// Parses one datagram; nullopt when malformed.
std::optional<Beat> parse_beat(std::string_view datagram);

// Chooses a socket path "<dir>/<name>" when it fits in sun_path, else a
// fresh private directory under /tmp ("/tmp/ddprun-hb-XXXXXX/<name>").
// Throws WatchdogError when neither works.
std::string choose_socket_path(const std::string& dir,
                               const std::string& name = base::kFileHeartbeatSocket);

class HeartbeatServer {
 public:
  using BeatHandler = std::function<void(const Beat&)>;

  // Binds `path` (an existing file there is removed first) and starts
  // receiving. Throws WatchdogError on failure.
  HeartbeatServer(boost::asio::io_context& io, std::string path, BeatHandler on_beat);
  // Closes the socket and unlinks the path (and the /tmp fallback dir).
  ~HeartbeatServer();
  HeartbeatServer(const HeartbeatServer&) = delete;
  HeartbeatServer& operator=(const HeartbeatServer&) = delete;

  const std::string& path() const { return path_; }
  uint64_t malformed_received() const { return malformed_; }

 private:
  void receive();
  void on_datagram(std::size_t n);

  boost::asio::local::datagram_protocol::socket socket_;
  std::string path_;
  BeatHandler on_beat_;
  char buf_[256];
  uint64_t malformed_ = 0;
  std::chrono::steady_clock::time_point last_warning_{};
  uint64_t suppressed_warnings_ = 0;
  // False once destroyed: a completion already queued when the socket closes
  // still runs (with success), and must not touch `this`.
  base::Liveness alive_;
};

}  // namespace ddprun::watchdog
