// Test helpers: a store server on its own thread, and a raw socket that can
// send bytes no well-behaved client would.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "rendezvous/client.h"
#include "rendezvous/server.h"

namespace ddprun::rendezvous::testing {

using namespace std::chrono_literals;

// TCP segments a socket has received, in all and those carrying data
// (bare ACKs are the difference): tests count segments, not time.
struct Segments {
  uint32_t in = 0, with_data = 0;
};
inline Segments segments_in(int fd) {
  // Linux's struct tcp_info grows at its end only (uapi); glibc's copy stops
  // before these fields (Linux 4.6+): tcpi_segs_in and tcpi_data_segs_in.
  constexpr size_t kSegsInOffset = 140, kDataSegsInOffset = 152;
  uint8_t info[256] = {};
  socklen_t len = sizeof(info);
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, info, &len) != 0 ||
      len < kDataSegsInOffset + sizeof(uint32_t)) {
    throw std::runtime_error("TCP_INFO without segment counts");
  }
  Segments s;
  std::memcpy(&s.in, info + kSegsInOffset, sizeof(s.in));
  std::memcpy(&s.with_data, info + kDataSegsInOffset, sizeof(s.with_data));
  return s;
}

// A Server running on a private io_context thread; destruction stops it.
class ServerThread {
 public:
  explicit ServerThread(ServerOptions o = {}) {
    if (o.host == "0.0.0.0") o.host = "127.0.0.1";
    server_ = std::make_unique<Server>(io_, o);
    port_ = server_->endpoint().port();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~ServerThread() { stop(); }
  void stop() {
    if (!thread_.joinable()) return;
    boost::asio::post(io_, [this] {
      server_->close();
      io_.stop();
    });
    thread_.join();
    server_.reset();
  }
  uint16_t port() const { return port_; }
  // The server's loop, to hold it (a handler that waits) in a test.
  boost::asio::io_context& io() { return io_; }

  // Runs `f` on the server's thread and returns its result.
  template <typename F>
  auto on_loop(F f) {
    std::promise<decltype(f())> p;
    auto fut = p.get_future();
    boost::asio::post(io_, [&] { p.set_value(f()); });
    return fut.get();
  }
  // Sets keys as a successor's store starts with them (Server::preload),
  // on the server's thread, before the test lets any client in.
  void preload(const std::vector<std::pair<std::string, wire::Bytes>>& records) {
    on_loop([&] {
      for (const auto& [key, value] : records) server_->preload(key, value);
      return 0;
    });
  }
  size_t waiters() { return on_loop([this] { return server_->num_waiters(); }); }
  size_t buffered() { return on_loop([this] { return server_->buffered_bytes(); }); }
  size_t connections() { return on_loop([this] { return server_->num_connections(); }); }
  // Hands the server a connected descriptor (Server::adopt), on its thread.
  void adopt(int fd, const std::string& peer) {
    on_loop([&] {
      server_->adopt(fd, peer);
      return 0;
    });
  }

  // Waits (bounded) until the server state satisfies `pred`.
  template <typename P>
  bool wait_for_state(P pred, std::chrono::milliseconds limit = 10s) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (pred(*this)) return true;
      std::this_thread::yield();
    }
    return false;
  }

  ClientOptions client_options(std::string token = "") const {
    ClientOptions c;
    c.host = "127.0.0.1";
    c.port = port_;
    c.token = std::move(token);
    c.connect_timeout = 5s;
    c.op_timeout = 10s;
    return c;
  }

 private:
  boost::asio::io_context io_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  uint16_t port_ = 0;
};

// A plain TCP connection to 127.0.0.1:port that speaks bytes, not ops.
// `source` picks the local address: every 127.x.y.z is loopback on Linux,
// so one machine can play several peers.
class RawConn {
 public:
  explicit RawConn(uint16_t port, const char* source = nullptr) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (source != nullptr) {
      sockaddr_in local{};
      local.sin_family = AF_INET;
      ::inet_pton(AF_INET, source, &local.sin_addr);
      if (::bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0) {
        ::close(fd_);
        throw std::runtime_error(std::string("raw bind to ") + source + " failed");
      }
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(fd_);
      throw std::runtime_error("raw connect failed");
    }
  }
  // Takes over a connected stream socket (one end of a socketpair).
  struct Adopt {};
  RawConn(Adopt, int fd) : fd_(fd) {}
  int fd() const { return fd_; }
  ~RawConn() { ::close(fd_); }
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;

  void send(const wire::Bytes& b) {
    size_t off = 0;
    while (off < b.size()) {
      ssize_t n = ::send(fd_, b.data() + off, b.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;  // the server may already have closed us
      off += static_cast<size_t>(n);
    }
  }
  // Reads one frame's payload; nullopt on EOF; throws on the deadline.
  std::optional<wire::Bytes> read_frame(std::chrono::milliseconds limit = 10s) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    auto fill = [&](size_t need) {
      while (buf_.size() < need) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        pollfd p{fd_, POLLIN, 0};
        if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) == 0) {
          throw std::runtime_error("raw read: deadline passed");
        }
        uint8_t tmp[65536];
        ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
        if (n <= 0) return false;
        buf_.insert(buf_.end(), tmp, tmp + n);
      }
      return true;
    };
    if (!fill(4)) return std::nullopt;
    uint32_t len = *wire::frame_length(buf_.data(), buf_.size());
    if (!fill(4 + len)) return std::nullopt;
    wire::Bytes payload(buf_.begin() + 4, buf_.begin() + 4 + len);
    buf_.erase(buf_.begin(), buf_.begin() + 4 + len);
    return payload;
  }
  // True when the server closed the connection before the deadline (frames
  // still in flight are skipped).
  bool closed_by_server(std::chrono::milliseconds limit = 10s) {
    for (;;) {
      if (!read_frame(limit)) return true;
    }
  }

 private:
  int fd_ = -1;
  wire::Bytes buf_;
};

inline wire::Bytes B(const std::string& s) { return to_bytes(s); }

// Routes spdlog's default logger into a string while alive (tests that
// check what the store or client warned about). The server thread logs
// while the test reads: both sides take the sink's mutex (an ostream_sink
// read through ostringstream::str() raced with the writer; ASan caught it
// as a heap-use-after-free of the stream's buffer).
struct LogCapture {
  class StringSink : public spdlog::sinks::base_sink<std::mutex> {
   public:
    std::string text() {
      std::lock_guard<std::mutex> lock(mutex_);
      return text_;
    }

   protected:
    void sink_it_(const spdlog::details::log_msg& msg) override {
      spdlog::memory_buf_t line;
      formatter_->format(msg, line);
      text_.append(line.data(), line.size());
    }
    void flush_() override {}

   private:
    std::string text_;
  };

  std::shared_ptr<StringSink> sink = std::make_shared<StringSink>();
  std::shared_ptr<spdlog::logger> previous = spdlog::default_logger();
  LogCapture() { spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink)); }
  ~LogCapture() { spdlog::set_default_logger(previous); }
  std::string str() { return sink->text(); }
};

}  // namespace ddprun::rendezvous::testing
