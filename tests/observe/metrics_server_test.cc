// The scrape endpoint on a real socket: the replies, and that a scraper
// that stalls or crowds in never holds the loop.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <future>
#include <thread>

#include "base/scoped_fd.h"
#include "observe/metrics_server.h"

namespace asio = boost::asio;
using ddprun::base::ScopedFd;
using ddprun::observe::http_reply;
using ddprun::observe::MetricsServer;
using ddprun::observe::MetricsServerOptions;

namespace {

constexpr auto kDeadline = std::chrono::seconds(30);  // generous: a loaded machine

// The server on a loop thread of its own, as the agent runs it.
class Served {
 public:
  explicit Served(MetricsServerOptions options) : guard_(asio::make_work_guard(io_)) {
    server_ = std::make_unique<MetricsServer>(io_, options, [this] {
      ++renders_;
      return std::string("ddprun_up 1\n");
    });
    thread_ = std::thread([this] { io_.run(); });
  }
  ~Served() {
    std::promise<void> gone;
    asio::post(io_, [&] {
      server_.reset();
      gone.set_value();
    });
    gone.get_future().wait();
    guard_.reset();
    io_.stop();
    thread_.join();
  }
  uint16_t port() const { return server_->port(); }
  int renders() const { return renders_; }

 private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> guard_;
  std::unique_ptr<MetricsServer> server_;
  std::atomic<int> renders_{0};
  std::thread thread_;
};

ScopedFd connect_to(uint16_t port) {
  ScopedFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(fd.get() >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

// Everything the server sends until it closes; "TIMEOUT" past the deadline.
std::string read_to_end(int fd) {
  std::string out;
  const auto until = std::chrono::steady_clock::now() + kDeadline;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return "TIMEOUT";
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

std::string ask(uint16_t port, const std::string& request) {
  ScopedFd fd = connect_to(port);
  REQUIRE(::write(fd.get(), request.data(), request.size()) == static_cast<ssize_t>(request.size()));
  return read_to_end(fd.get());
}

}  // namespace

TEST_CASE("replies: 200 with the exposition at /metrics, 404, 405, HEAD without a body") {
  auto render = [] { return std::string("m 1\n"); };
  const auto ok = http_reply("GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n", render);
  CHECK(ok.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(ok.find("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n") != std::string::npos);
  CHECK(ok.find("Content-Length: 4\r\n") != std::string::npos);
  CHECK(ok.substr(ok.size() - 4) == "m 1\n");
  CHECK(http_reply("GET /other HTTP/1.1\r\n\r\n", render).rfind("HTTP/1.1 404", 0) == 0);
  CHECK(http_reply("POST /metrics HTTP/1.1\r\n\r\n", render).rfind("HTTP/1.1 405", 0) == 0);
  CHECK(http_reply("garbage\r\n\r\n", render).rfind("HTTP/1.1 400", 0) == 0);
  const auto head = http_reply("HEAD /metrics HTTP/1.1\r\n\r\n", render);
  CHECK(head.find("Content-Length: 4\r\n") != std::string::npos);
  CHECK(head.substr(head.size() - 4) == "\r\n\r\n");
}

TEST_CASE("a scrape over a real socket gets the rendered text") {
  Served s(MetricsServerOptions{});
  const std::string reply = ask(s.port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(reply.rfind("HTTP/1.1 200 OK", 0) == 0);
  CHECK(reply.find("\r\n\r\nddprun_up 1\n") != std::string::npos);
}

TEST_CASE("a scraper that never sends its request does not stall the others, and is dropped") {
  MetricsServerOptions o;
  o.deadline = std::chrono::milliseconds(300);
  Served s(o);
  ScopedFd silent = connect_to(s.port());
  // Answered while the silent one is still connected: the loop did not wait for it.
  CHECK(ask(s.port(), "GET /metrics HTTP/1.1\r\n\r\n").find("ddprun_up 1") != std::string::npos);
  // Its deadline closes it: EOF, nothing said.
  CHECK(read_to_end(silent.get()).empty());
}

TEST_CASE("an oversized request is closed unanswered") {
  Served s(MetricsServerOptions{});
  ScopedFd fd = connect_to(s.port());
  const std::string big = "GET /metrics HTTP/1.1\r\nX: " + std::string(MetricsServer::kMaxRequestBytes, 'a');
  (void)::send(fd.get(), big.data(), big.size(), MSG_NOSIGNAL);
  CHECK(read_to_end(fd.get()).empty());
  CHECK(s.renders() == 0);
}

TEST_CASE("past max_connections a new scraper is closed at accept") {
  MetricsServerOptions o;
  o.max_connections = 2;
  Served s(o);
  ScopedFd a = connect_to(s.port());
  ScopedFd b = connect_to(s.port());
  ScopedFd c = connect_to(s.port());
  CHECK(read_to_end(c.get()).empty());
  // The first two are still served.
  const std::string req = "GET /metrics HTTP/1.1\r\n\r\n";
  REQUIRE(::write(a.get(), req.data(), req.size()) > 0);
  CHECK(read_to_end(a.get()).find("ddprun_up 1") != std::string::npos);
}

TEST_CASE("a port in use is an error naming the address and port") {
  Served s(MetricsServerOptions{});
  asio::io_context io;
  MetricsServerOptions o;
  o.port = s.port();
  try {
    MetricsServer second(io, o, [] { return std::string(); });
    FAIL("a second server bound the same port");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("127.0.0.1 port " + std::to_string(s.port())) != std::string::npos);
  }
  o.address = "localhost";
  CHECK_THROWS_WITH_AS(MetricsServer(io, o, [] { return std::string(); }),
                       doctest::Contains("not an IP address"), std::runtime_error);
}
