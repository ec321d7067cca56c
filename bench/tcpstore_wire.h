// c10d's TCPStore protocol, the little of it store_attack_bench needs: a
// blocking client that does what torch's own TCPStore client does for
// set/get, and the hostile suite's attacks (tests/rendezvous/hostile.h)
// spelled in TCPStore's bytes.
//
// The layout (torch/csrc/distributed/c10d/TCPStore.cpp; little-endian):
//   request  := u8 query, args
//   string   := u64 n, byte[n]
//   SET      := key:string value:string            (no reply)
//   WAIT     := u64 count, key:string[count]       -> u8 STOP_WAITING (0)
//   GET      := key:string                         -> value:string
// torch 2.x numbers the queries from VALIDATE = 0 and its client opens with
// VALIDATE u32 0x3C85F7CE; torch 1.13 has no VALIDATE (SET = 0).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/scoped_fd.h"
#include "base/system_error.h"
#include "rendezvous/tcpstore_codec.h"

namespace ddprun::bench::tcpstore {

namespace ts = ddprun::rendezvous::tcpstore;
using Bytes = ts::Bytes;

// Which of torch's two numberings a client speaks.
struct Protocol {
  bool v2 = true;  // torch >= 2: VALIDATE first, queries shifted by one
  ts::Dialect dialect() const { return v2 ? ts::Dialect::kV2 : ts::Dialect::kLegacy; }
  uint8_t op(ts::Op o) const { return ts::opcode(dialect(), o); }
  // What a client sends right after connecting.
  Bytes hello() const {
    if (!v2) return {};
    Bytes b{op(ts::Op::kValidate)};
    ts::put_u32(b, ts::kValidateMagic);
    return b;
  }
};

inline void append(Bytes& b, const Bytes& x) { b.insert(b.end(), x.begin(), x.end()); }

// One blocking connection; every receive has a 5 s deadline.
class Client {
 public:
  Client(uint16_t port, Protocol p) : p_(p), fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    if (!fd_) throw std::runtime_error("TCPStore client: socket failed");
    timeval tv{5, 0};
    ::setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd_.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    ::setsockopt(fd_.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      const int err = errno;
      // (SO_SNDTIMEO bounds a blocking connect too: EINPROGRESS after 5 s.)
      throw std::runtime_error("TCPStore client: connect to 127.0.0.1:" + std::to_string(port) +
                               (err == EINPROGRESS ? " not accepted within 5 s"
                                                   : " failed: " + ddprun::base::errno_text(err)));
    }
    send(p_.hello());
  }

  void set(const std::string& key, const Bytes& value) {
    Bytes b{p_.op(ts::Op::kSet)};
    ts::put_string(b, key);
    ts::put_string(b, value);
    send(b);
  }
  // As torch's client does: WAIT for the key, then GET it.
  Bytes get(const std::string& key) {
    Bytes w{p_.op(ts::Op::kWait)};
    ts::put_u64(w, 1);
    ts::put_string(w, key);
    send(w);
    uint8_t stop = 0xff;
    recv(&stop, 1);
    if (stop != 0) throw std::runtime_error("TCPStore client: wait(" + key + ") was not answered");
    Bytes g{p_.op(ts::Op::kGet)};
    ts::put_string(g, key);
    send(g);
    uint8_t n[8];
    recv(n, 8);
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i) len = len << 8 | n[i];
    if (len > (64u << 20)) throw std::runtime_error("TCPStore client: absurd value length");
    Bytes v(len);
    recv(v.data(), len);
    return v;
  }

 private:
  void send(const Bytes& b) {
    if (!ddprun::base::send_fully(fd_.get(), b.data(), b.size()))
      throw std::runtime_error("TCPStore client: send failed");
  }
  void recv(uint8_t* p, size_t len) {
    if (!ddprun::base::read_fully(fd_.get(), p, len))
      throw std::runtime_error("TCPStore client: no reply within 5 s, or closed");
  }
  Protocol p_;
  ddprun::base::ScopedFd fd_;
};

// --- The hostile suite's attacks, in TCPStore's bytes. ---

// A SET whose key announces 4 MiB, 1 MiB of it sent.
inline Bytes partial_big_frame(Protocol p) {
  Bytes b = p.hello();
  b.push_back(p.op(ts::Op::kSet));
  ts::put_u64(b, 4u << 20);
  b.resize(b.size() + (1u << 20), 'p');
  return b;
}

// A ~4 MiB WAIT on 1,000 keys that never appear, and another behind it.
inline Bytes wait_flood(Protocol p) {
  Bytes one{p.op(ts::Op::kWait)};
  ts::put_u64(one, 1000);
  std::string pad(4000, 'w');
  for (int i = 0; i < 1000; ++i) ts::put_string(one, "never/" + std::to_string(i) + pad);
  Bytes b = p.hello();
  append(b, one);
  append(b, one);
  return b;
}

// 24 GETs of a 1 MiB value (as much as ddprun's 8 multi_gets of 3), never read.
inline Bytes unread_replies(Protocol p) {
  Bytes b = p.hello();
  for (int i = 0; i < 24; ++i) {
    b.push_back(p.op(ts::Op::kGet));
    ts::put_string(b, "hostile/big");
  }
  return b;
}

// 4,096 SETs of tiny unique keys.
inline Bytes key_flood(Protocol p, size_t conn, uint64_t round) {
  Bytes b = round == 0 ? p.hello() : Bytes{};
  for (int i = 0; i < 4096; ++i) {
    b.push_back(p.op(ts::Op::kSet));
    ts::put_string(b, std::to_string(conn) + "." + std::to_string(round) + "." + std::to_string(i));
    ts::put_string(b, Bytes{'x'});
  }
  return b;
}

// The quadratic-notify attack (hostile.h's wait_on_many): one WAIT on
// 8,192 keys, 8,191 shared ("q/0".."q/8190") and one of its own that never
// appears.
inline Bytes wait_on_many(Protocol p, size_t conn) {
  Bytes b = p.hello();
  b.push_back(p.op(ts::Op::kWait));
  ts::put_u64(b, 8192);
  for (int i = 0; i < 8191; ++i) ts::put_string(b, "q/" + std::to_string(i));
  ts::put_string(b, "q/never/" + std::to_string(conn));
  return b;
}

// ...and the loop that sets those shared keys and deletes them again.
// (DELETE_KEY is query 8 in both torch 1.13, after WATCH_KEY, and 2.x.)
inline Bytes set_delete_loop(Protocol p, uint64_t round) {
  Bytes b = round == 0 ? p.hello() : Bytes{};
  for (int i = 0; i < 8191; ++i) {
    b.push_back(p.op(ts::Op::kSet));
    ts::put_string(b, "q/" + std::to_string(i));
    ts::put_string(b, Bytes{'s'});
  }
  for (int i = 0; i < 8191; ++i) {
    b.push_back(p.op(ts::Op::kDeleteKey));
    ts::put_string(b, "q/" + std::to_string(i));
  }
  return b;
}

}  // namespace ddprun::bench::tcpstore
