// The multi-node worker's way to meet where the job has no ddprun store
// (the etcd backend): as torch's env:// does under
// TORCHELASTIC_USE_AGENT_STORE=True, a c10d TCPStore client of the agent's
// store at MASTER_ADDR:MASTER_PORT (rendezvous/tcpstore_server.h), in torch
// 2.x's bytes (rendezvous/tcpstore_codec.h). Blocking, every receive bounded
// by SO_RCVTIMEO.
#pragma once

#include <netdb.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "rendezvous/tcpstore_codec.h"

namespace mn {

namespace ts = ddprun::rendezvous::tcpstore;

class TcpStoreMeet {
 public:
  TcpStoreMeet(const std::string& host, const std::string& port, std::chrono::seconds timeout) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0)
      throw std::runtime_error("tcpstore: cannot resolve " + host);
    for (addrinfo* ai = res; ai && fd_ < 0; ai = ai->ai_next) {
      int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
      if (fd < 0) continue;
      timeval tv{static_cast<time_t>(timeout.count()), 0};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
      if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
        fd_ = fd;
      } else {
        ::close(fd);
      }
    }
    freeaddrinfo(res);
    if (fd_ < 0) throw std::runtime_error("tcpstore: cannot connect to " + host + ":" + port);
    ts::Bytes hello{ts::opcode(ts::Dialect::kV2, ts::Op::kValidate)};
    ts::put_u32(hello, ts::kValidateMagic);
    send(hello);
  }
  ~TcpStoreMeet() {
    if (fd_ >= 0) ::close(fd_);
  }
  TcpStoreMeet(const TcpStoreMeet&) = delete;
  TcpStoreMeet& operator=(const TcpStoreMeet&) = delete;

  void set(const std::string& key, const std::string& value) {
    ts::Bytes b{ts::opcode(ts::Dialect::kV2, ts::Op::kSet)};
    ts::put_string(b, key);
    ts::put_string(b, value);
    send(b);
  }
  // Waits until every key exists (the server answers STOP_WAITING).
  void wait(const std::vector<std::string>& keys) {
    ts::Bytes b{ts::opcode(ts::Dialect::kV2, ts::Op::kWait)};
    ts::put_u64(b, keys.size());
    for (const auto& k : keys) ts::put_string(b, k);
    send(b);
    uint8_t stop = 0xff;
    recv(&stop, 1);
    if (stop != 0) throw std::runtime_error("tcpstore: wait was not answered STOP_WAITING");
  }

 private:
  void send(const ts::Bytes& b) {
    size_t off = 0;
    while (off < b.size()) {
      ssize_t n = ::send(fd_, b.data() + off, b.size() - off, MSG_NOSIGNAL);
      if (n <= 0) throw std::runtime_error("tcpstore: send failed");
      off += static_cast<size_t>(n);
    }
  }
  void recv(uint8_t* p, size_t len) {
    size_t off = 0;
    while (off < len) {
      ssize_t n = ::recv(fd_, p + off, len - off, 0);
      if (n <= 0) throw std::runtime_error("tcpstore: no reply within the timeout, or closed");
      off += static_cast<size_t>(n);
    }
  }
  int fd_ = -1;
};

}  // namespace mn
