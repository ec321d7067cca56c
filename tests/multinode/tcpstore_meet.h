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

#include "base/scoped_fd.h"
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
    for (addrinfo* ai = res; ai && !fd_; ai = ai->ai_next) {
      ddprun::base::ScopedFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
      if (!fd) continue;
      timeval tv{static_cast<time_t>(timeout.count()), 0};
      ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
      if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0) fd_ = std::move(fd);
    }
    freeaddrinfo(res);
    if (!fd_) throw std::runtime_error("tcpstore: cannot connect to " + host + ":" + port);
    ts::Bytes hello{ts::opcode(ts::Dialect::kV2, ts::Op::kValidate)};
    ts::put_u32(hello, ts::kValidateMagic);
    send(hello);
  }

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
    if (!ddprun::base::send_fully(fd_.get(), b.data(), b.size()))
      throw std::runtime_error("tcpstore: send failed");
  }
  void recv(uint8_t* p, size_t len) {
    if (!ddprun::base::read_fully(fd_.get(), p, len))
      throw std::runtime_error("tcpstore: no reply within the timeout, or closed");
  }
  ddprun::base::ScopedFd fd_;
};

}  // namespace mn
