// A client without a token does not wait for the store's greeting: its
// first request goes out right after the TCP connect and the greeting is
// read in front of the first reply (issue 24: one round trip less per
// connection, and a connection that the kernel's full accept queue left
// half-open is retransmitted into the store by the client's own data, as
// torch's client does, instead of waiting seconds for the store's SYN-ACK).
// A connection the store refuses at accept (a connection limit) closes
// before its greeting, so nothing on it was served: the first call sends
// again, even an add.
#include <doctest/doctest.h>
#include <poll.h>
#include <sys/socket.h>

#include <future>
#include <thread>

#include "base/scoped_fd.h"
#include "tests/rendezvous/test_util.h"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::testing;
using namespace std::chrono_literals;

namespace {
// A listener that is no store yet: it accepts, then says nothing.
struct SilentListener {
  ddprun::base::ScopedFd fd{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  uint16_t port = 0;
  SilentListener() {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), len) == 0);
    REQUIRE(::listen(fd.get(), 4) == 0);
    REQUIRE(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
  RawConn accept_one() {
    pollfd p{fd.get(), POLLIN, 0};
    REQUIRE(::poll(&p, 1, 10000) == 1);
    return RawConn(RawConn::Adopt{}, ::accept4(fd.get(), nullptr, nullptr, SOCK_CLOEXEC));
  }
};
}  // namespace

TEST_CASE("a client without a token sends its first request before the store's greeting") {
  SilentListener store;
  ClientOptions o;
  o.host = "127.0.0.1";
  o.port = store.port;
  o.connect_timeout = 5s;
  o.op_timeout = 10s;
  Client c(o);  // returns with the TCP connection: no greeting has been sent
  auto added = std::async(std::launch::async, [&] { return c.add("n", 1); });
  RawConn conn = store.accept_one();
  // The add arrives although the store has not written a byte yet.
  auto payload = conn.read_frame();
  REQUIRE(payload);
  const auto n = static_cast<uint32_t>(payload->size());
  wire::Bytes frame{static_cast<uint8_t>(n), static_cast<uint8_t>(n >> 8), static_cast<uint8_t>(n >> 16),
                    static_cast<uint8_t>(n >> 24)};
  frame.insert(frame.end(), payload->begin(), payload->end());
  wire::ParseResult r = wire::parse_request(frame.data(), frame.size());
  REQUIRE(r.kind == wire::ParseResult::kOk);
  CHECK(r.request.op == wire::Op::kAdd);
  CHECK(r.request.keys == std::vector<std::string>{"n"});
  wire::Greeting g;
  wire::Bytes out = wire::encode_greeting(g);
  {
    wire::Writer w(out);
    w.u8(static_cast<uint8_t>(wire::Status::kOk));
    w.u64(41);
  }
  conn.send(out);  // the greeting and the reply in one segment
  REQUIRE(added.wait_for(10s) == std::future_status::ready);
  CHECK(added.get() == 41);
}

TEST_CASE("an add refused at accept is sent again once a slot frees, and counted once") {
  LogCapture log;
  ServerOptions so;
  so.max_connections = 1;
  ServerThread server(so);
  auto holder = std::make_unique<Client>(server.client_options());
  holder->ping();
  Client c(server.client_options());
  auto added = std::async(std::launch::async, [&] { return c.add("n", 1); });
  // Wait (bounded) until the store has turned the add's connection away.
  REQUIRE(server.wait_for_state(
      [&](ServerThread&) { return log.str().find("refusing a connection") != std::string::npos; }));
  holder.reset();
  REQUIRE(added.wait_for(10s) == std::future_status::ready);
  CHECK(added.get() == 1);
  CHECK(c.get("n", 1s) == wire::Bytes{'1'});
}

TEST_CASE("the greeting leaves with the reply to a request that came with the connection") {
  ServerThread server;
  // The store's loop is held while the client connects and sends, as a
  // loaded store meets a connect burst: the add is there when it accepts.
  std::promise<void> release;
  std::promise<void> held;
  boost::asio::post(server.io(), [&] {
    held.set_value();
    release.get_future().wait();
  });
  held.get_future().wait();
  RawConn raw(server.port());
  int one = 1;
  REQUIRE(::setsockopt(raw.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0);
  wire::Request add;
  add.op = wire::Op::kAdd;
  add.keys = {"n"};
  add.delta = 1;
  raw.send(wire::encode_request(add));
  const Segments before = segments_in(raw.fd());
  release.set_value();
  auto greeting = raw.read_frame();
  REQUIRE(greeting);
  CHECK(wire::parse_greeting(greeting->data(), greeting->size()));
  auto reply = raw.read_frame();
  REQUIRE(reply);
  CHECK(wire::parse_reply(wire::Op::kAdd, reply->data(), reply->size()).number == 1);
  CHECK(segments_in(raw.fd()).with_data - before.with_data == 1);
}
