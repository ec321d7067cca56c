// The agent's control socket server (wire format: control_wire.h), on the
// agent's io_context: accept, read one request line, hand it to the
// handler, write its reply, close. Nothing blocks the loop; each connection
// has a deadline (kRequestDeadline to send its request, then the handler's
// own bound) after which it is closed. Peers of another user are refused
// (SO_PEERCRED), on top of the socket's private folder.
//
// Thread safety: io_context thread only. A handler may reply later (from a
// posted completion); `reply` must then be called on the loop thread.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "base/liveness.h"

namespace ddprun::introspect {

class ControlServer {
 public:
  using Reply = std::function<void(const nlohmann::json&)>;
  using Handler = std::function<void(const nlohmann::json& request, Reply reply)>;

  // Binds `path` (replacing a stale socket file); throws std::runtime_error
  // naming the path on failure.
  ControlServer(boost::asio::io_context& io, std::string path, Handler handler);
  ~ControlServer();
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  const std::string& path() const { return path_; }

 private:
  void accept();

  boost::asio::io_context& io_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  std::string path_;
  Handler handler_;
  base::Liveness alive_;
};

}  // namespace ddprun::introspect
