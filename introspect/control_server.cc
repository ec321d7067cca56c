#include "introspect/control_server.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <spdlog/spdlog.h>
#include <stdexcept>

#include "introspect/control_wire.h"

namespace ddprun::introspect {

namespace asio = boost::asio;
using stream = asio::local::stream_protocol;

namespace {

// One client: its socket, buffer and deadline live until the reply is
// written or the deadline closes it.
struct Connection : std::enable_shared_from_this<Connection> {
  explicit Connection(asio::io_context& io)
      : socket(io), timer(io), buffer(control_wire::kMaxRequestBytes) {}
  stream::socket socket;
  asio::steady_timer timer;
  asio::streambuf buffer;
  std::string out;
  bool replied = false;

  void close() {
    boost::system::error_code ec;
    timer.cancel();
    socket.close(ec);
  }
  void arm(std::chrono::seconds limit) {
    timer.expires_after(limit);
    timer.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->close();  // the deadline passed: drop the client
    });
  }
  void send(const nlohmann::json& reply) {
    if (replied || !socket.is_open()) return;
    replied = true;
    out = reply.dump() + "\n";
    if (out.size() > control_wire::kMaxReplyBytes) {
      out = nlohmann::json{{"error", "reply too large"}}.dump() + "\n";
    }
    asio::async_write(socket, asio::buffer(out),
                      [self = shared_from_this()](const boost::system::error_code&, std::size_t) {
                        self->close();
                      });
  }
};

bool same_user(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  return ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == ::getuid();
}

}  // namespace

ControlServer::ControlServer(asio::io_context& io, std::string path, Handler handler)
    : io_(io), acceptor_(io), path_(std::move(path)), handler_(std::move(handler)) {
  if (path_.size() >= sizeof(sockaddr_un::sun_path)) {
    throw std::runtime_error("control socket path too long for AF_UNIX: " + path_);
  }
  ::unlink(path_.c_str());
  boost::system::error_code ec;
  acceptor_.open(stream(), ec);
  if (!ec) acceptor_.bind(stream::endpoint(path_), ec);
  if (!ec) acceptor_.listen(16, ec);
  if (ec) throw std::runtime_error("cannot listen on control socket " + path_ + ": " + ec.message());
  accept();
}

ControlServer::~ControlServer() {
  alive_.revoke();
  boost::system::error_code ec;
  acceptor_.close(ec);
  ::unlink(path_.c_str());
}

void ControlServer::accept() {
  auto conn = std::make_shared<Connection>(io_);
  acceptor_.async_accept(conn->socket, [this, conn, alive = alive_.token()](
                                           const boost::system::error_code& ec) {
    if (!alive || ec == asio::error::operation_aborted) return;
    accept();  // keep accepting whatever happens to this client
    if (ec) return;
    if (!same_user(conn->socket.native_handle())) {
      conn->close();
      return;
    }
    conn->arm(control_wire::kRequestDeadline);
    asio::async_read_until(
        conn->socket, conn->buffer, '\n',
        [this, conn, alive](const boost::system::error_code& ec, std::size_t n) {
          if (!alive || ec) {
            conn->close();
            return;
          }
          std::string line(asio::buffers_begin(conn->buffer.data()),
                           asio::buffers_begin(conn->buffer.data()) + static_cast<long>(n));
          nlohmann::json request;
          try {
            request = nlohmann::json::parse(line);
          } catch (const std::exception& e) {
            conn->send({{"error", std::string("bad request: ") + e.what()}});
            return;
          }
          conn->timer.cancel();
          conn->arm(control_wire::kStacksDeadline);
          handler_(request, [conn](const nlohmann::json& reply) { conn->send(reply); });
        });
  });
}

}  // namespace ddprun::introspect
