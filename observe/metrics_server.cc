#include "observe/metrics_server.h"

#include <fmt/format.h>

#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <stdexcept>

#include "observe/exposition.h"

namespace ddprun::observe {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

// One scraper: its socket, request buffer, reply and deadline live until
// the reply is written or the deadline closes it.
struct Connection : std::enable_shared_from_this<Connection> {
  Connection(asio::io_context& io, std::shared_ptr<int> open)
      : socket(io), timer(io), buffer(MetricsServer::kMaxRequestBytes), open(std::move(open)) {
    ++*this->open;
  }
  ~Connection() { --*open; }
  tcp::socket socket;
  asio::steady_timer timer;
  asio::streambuf buffer;
  std::string reply;
  std::shared_ptr<int> open;

  void close() {
    boost::system::error_code ec;
    timer.cancel();
    socket.shutdown(tcp::socket::shutdown_both, ec);
    socket.close(ec);
  }
  void arm(std::chrono::milliseconds limit) {
    timer.expires_after(limit);
    timer.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->close();  // the deadline passed: drop the scraper
    });
  }
};

std::string response(int code, const char* reason, const char* type, const std::string& body,
                     bool head) {
  std::string r = fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
      code, reason, type, body.size());
  if (!head) r += body;
  return r;
}

}  // namespace

std::string http_reply(const std::string& request, const MetricsServer::Render& render) {
  const auto line_end = request.find("\r\n");
  const std::string line = request.substr(0, line_end);
  const auto sp1 = line.find(' ');
  const auto sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string::npos)
    return response(400, "Bad Request", "text/plain", "bad request line\n", false);
  const std::string method = line.substr(0, sp1);
  std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  const bool head = method == "HEAD";
  if (method != "GET" && !head)
    return response(405, "Method Not Allowed", "text/plain", "GET /metrics\n", false);
  if (path == "/metrics") return response(200, "OK", kExpositionContentType, render(), head);
  if (path == "/")
    return response(200, "OK", "text/plain", "ddprun: the metrics are at /metrics\n", head);
  return response(404, "Not Found", "text/plain", "not found: the metrics are at /metrics\n", head);
}

MetricsServer::MetricsServer(asio::io_context& io, MetricsServerOptions options, Render render)
    : io_(io), options_(std::move(options)), render_(std::move(render)), acceptor_(io) {
  const std::string where = fmt::format("{} port {}", options_.address, options_.port);
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(options_.address, ec);
  if (ec) throw std::runtime_error("cannot serve metrics on " + where + ": not an IP address");
  const tcp::endpoint endpoint(address, options_.port);
  acceptor_.open(endpoint.protocol(), ec);
  // A restarted agent takes its port back at once, not after TIME_WAIT.
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(64, ec);
  if (ec) throw std::runtime_error("cannot serve metrics on " + where + ": " + ec.message());
  port_ = acceptor_.local_endpoint(ec).port();
  accept();
}

MetricsServer::~MetricsServer() {
  alive_.revoke();
  boost::system::error_code ec;
  acceptor_.close(ec);
}

std::string MetricsServer::url() const {
  const bool v6 = options_.address.find(':') != std::string::npos;
  return fmt::format("http://{}{}{}:{}/metrics", v6 ? "[" : "", options_.address, v6 ? "]" : "",
                     port_);
}

void MetricsServer::accept() {
  auto conn = std::make_shared<Connection>(io_, open_);
  acceptor_.async_accept(conn->socket, [this, conn, alive = alive_.token()](
                                           const boost::system::error_code& ec) {
    if (!alive || ec == asio::error::operation_aborted) return;
    accept();  // keep accepting whatever happens to this scraper
    if (ec) return;
    // This connection counts itself, the one accept() just made too.
    if (*conn->open - 1 > options_.max_connections) {
      conn->close();
      return;
    }
    conn->arm(options_.deadline);
    asio::async_read_until(
        conn->socket, conn->buffer, "\r\n\r\n",
        [this, conn, alive](const boost::system::error_code& ec, std::size_t n) {
          // A read error, an oversized request, the deadline: nothing to say.
          if (!alive || ec) {
            conn->close();
            return;
          }
          const std::string request(asio::buffers_begin(conn->buffer.data()),
                                    asio::buffers_begin(conn->buffer.data()) +
                                        static_cast<std::ptrdiff_t>(n));
          conn->reply = http_reply(request, render_);
          asio::async_write(conn->socket, asio::buffer(conn->reply),
                            [conn](const boost::system::error_code&, std::size_t) {
                              conn->close();
                            });
        });
  });
}

}  // namespace ddprun::observe
