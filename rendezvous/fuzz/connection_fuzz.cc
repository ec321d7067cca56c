// libFuzzer target for the server's connection handling: a real Server
// serves one end of a socketpair (Server::adopt) and the input is a
// sequence of frames on that one connection, authentication included.
//
// Input byte 0 picks the setting: bit 0 a token on the server, bit 1 the
// harness answers the challenge correctly before the rest (a fuzzer cannot
// compute an HMAC over a random nonce). The rest is written to the
// connection in slices while the server's loop runs. After it, the server
// must still be consistent: closing it releases every buffered byte.
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <cstdlib>

#include "base/scoped_fd.h"
#include "rendezvous/auth.h"
#include "rendezvous/server.h"

using namespace ddprun::rendezvous;

namespace {
const std::string kToken = "fuzz-token";

// Reads what the server sent so far (never blocks).
void drain(int fd, wire::Bytes* keep) {
  uint8_t buf[65536];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0) return;
    if (keep) keep->insert(keep->end(), buf, buf + n);
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static bool quiet = (spdlog::set_level(spdlog::level::off), true);
  (void)quiet;
  if (size == 0) return 0;
  const bool token = data[0] & 1, answer = data[0] & 2;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 0;
  const ddprun::base::ScopedFd peer(sv[1]);  // the fuzzer's end; sv[0] is the server's
  boost::asio::io_context io;
  ServerOptions o;
  o.host = "127.0.0.1";
  o.token = token ? kToken : "";
  o.max_buffered_bytes = 1 << 20;  // small, so the limit is exercised
  {
    Server server(io, o);
    server.adopt(sv[0], "fuzz");
    io.poll();
    if (token && answer) {
      wire::Bytes in;
      drain(sv[1], &in);
      auto len = wire::frame_length(in.data(), in.size());
      auto g = len ? wire::parse_greeting(in.data() + 4, in.size() - 4) : std::nullopt;
      if (!g) abort();  // the greeting is always there and well formed
      wire::Request q;
      q.op = wire::Op::kAuth;
      wire::Bytes mine(wire::kNonceSize, 5);
      q.values = {auth_mac(kToken, wire::kClientAuthLabel, g->nonce, mine), mine};
      wire::Bytes f = wire::encode_request(q);
      if (::send(sv[1], f.data(), f.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(f.size())) abort();
      io.poll();
    }
    size_t pos = 1;
    while (pos < size) {
      size_t slice = std::min<size_t>(size - pos, 1 + data[pos] % 64 * 97);
      ssize_t n = ::send(sv[1], data + pos, slice, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n <= 0) break;  // the server closed us, or its buffer is full
      pos += static_cast<size_t>(n);
      io.poll();
      drain(sv[1], nullptr);
    }
    ::shutdown(sv[1], SHUT_WR);
    io.poll();
    server.close();
    io.poll();
    if (server.buffered_bytes() != 0 || server.num_connections() != 0) abort();
  }
  return 0;
}
