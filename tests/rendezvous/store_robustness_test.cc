// Hostile and unlucky clients: bad frames, limits, slow-loris, wrong
// tokens, connection limits, server restarts. After each, the server must
// still serve a well-behaved client.
#include <doctest/doctest.h>
#include <spdlog/spdlog.h>

#include <random>
#include <sstream>

#include "rendezvous/auth.h"
#include "tests/rendezvous/stall_proxy.h"
#include "tests/rendezvous/test_util.h"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::testing;

namespace {

void still_serves(ServerThread& server, const std::string& token = "") {
  Client c(server.client_options(token));
  c.set("alive", B("yes"));
  CHECK(c.get("alive", 1s) == B("yes"));
}

std::string error_text(const wire::Bytes& payload) {
  REQUIRE(!payload.empty());
  CHECK(payload[0] == static_cast<uint8_t>(wire::Status::kError));
  std::string message;
  wire::Reader r(payload.data() + 1, payload.size() - 1);
  r.str(message, wire::kMaxFrameSize);
  return message;
}

// Captures the server's log lines for the duration of a test.
}  // namespace

TEST_CASE("garbage bytes get an error reply and a closed connection; others are served") {
  ServerThread server;
  std::mt19937 rng(7);
  for (int round = 0; round < 20; ++round) {
    RawConn raw(server.port());
    REQUIRE(raw.read_frame());  // greeting
    wire::Bytes junk(64 + round * 13);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    // A whole frame, so the parser must look inside it.
    junk[0] = static_cast<uint8_t>(junk.size() - 4);
    junk[1] = static_cast<uint8_t>((junk.size() - 4) >> 8);
    junk[2] = junk[3] = 0;
    junk[4] = 0xEE;  // no such opcode
    raw.send(junk);
    auto reply = raw.read_frame();
    REQUIRE(reply);
    CHECK(error_text(*reply).find("unknown opcode 238") != std::string::npos);
    CHECK(raw.closed_by_server());
  }
  still_serves(server);
}

TEST_CASE("a frame header over the size limit is refused before its body arrives") {
  ServerThread server;
  RawConn raw(server.port());
  REQUIRE(raw.read_frame());
  raw.send({0xff, 0xff, 0xff, 0x7f});
  auto reply = raw.read_frame();
  REQUIRE(reply);
  CHECK(error_text(*reply).find("exceeds the limit") != std::string::npos);
  CHECK(raw.closed_by_server());
  still_serves(server);
}

TEST_CASE("a truncated frame followed by a hang-up leaves the server serving") {
  ServerThread server;
  {
    RawConn raw(server.port());
    REQUIRE(raw.read_frame());
    wire::Request q;
    q.op = wire::Op::kSet;
    q.keys = {"half"};
    q.values = {wire::Bytes(1000, 1)};
    wire::Bytes f = wire::encode_request(q);
    f.resize(f.size() / 2);
    raw.send(f);
  }
  still_serves(server);
  CHECK_FALSE(Client(server.client_options()).check({"half"}));
}

TEST_CASE("oversized keys and values are refused with an error naming the limit") {
  ServerThread server;
  Client c(server.client_options());
  CHECK_THROWS_WITH_AS(c.set(std::string(wire::kMaxKeySize + 1, 'k'), B("v")),
                       doctest::Contains("key longer than 4096"), StoreError);
  // the same client reconnects for its next call
  c.set("ok", B("1"));
  CHECK_THROWS_WITH_AS(c.set("big", wire::Bytes(wire::kMaxValueSize + 1)),
                       doctest::Contains("value longer than"), StoreError);
  c.set("big", wire::Bytes(wire::kMaxValueSize));
  CHECK_THROWS_WITH_AS(c.append("big", B("x")), doctest::Contains("would exceed"), StoreError);
  CHECK(c.get("big", 1s).size() == wire::kMaxValueSize);
  still_serves(server);
}

TEST_CASE("the store refuses writes beyond its byte budget") {
  ServerOptions o;
  o.max_store_bytes = 1200;  // each key is also charged 64 bytes of bookkeeping
  ServerThread server(o);
  Client c(server.client_options());
  c.set("a", wire::Bytes(900));
  // set is acknowledged lazily: the next call reports the refusal, naming it
  c.set("b", wire::Bytes(200));
  CHECK_THROWS_WITH_AS(c.ping(), doctest::Contains("set('b'): store full"), StoreError);
  CHECK_FALSE(c.check({"b"}));
  c.remove("a");
  c.set("b", wire::Bytes(200));
  CHECK(c.get("b", 1s).size() == 200);
}

TEST_CASE("a slow-loris client is closed; others are served meanwhile") {
  ServerOptions o;
  o.partial_frame_timeout = 300ms;
  ServerThread server(o);
  RawConn loris(server.port());
  REQUIRE(loris.read_frame());
  loris.send({10, 0});  // half a header, then nothing
  still_serves(server);
  CHECK(loris.closed_by_server(10s));
  CHECK(server.wait_for_state([](ServerThread& s) { return s.connections() == 0; }));
}

TEST_CASE("a blocked get is not mistaken for a slow-loris") {
  ServerOptions o;
  o.partial_frame_timeout = 100ms;
  ServerThread server(o);
  Client c(server.client_options());
  CHECK_THROWS_AS(c.get("k", 400ms), TimeoutError);  // outlives the partial-frame window
  c.set("k", B("v"));
  CHECK(c.get("k", 1s) == B("v"));
}

TEST_CASE("a wrong or missing token is refused on both sides; the right one works") {
  LogCapture log;
  ServerOptions o;
  o.token = "s3cret-token";
  ServerThread server(o);
  CHECK_THROWS_WITH_AS(Client(server.client_options("wrong")),
                       doctest::Contains("refused the token"), StoreError);
  // Without a token the greeting is read with the first reply.
  CHECK_THROWS_WITH_AS(Client(server.client_options("")).ping(), doctest::Contains("requires a token"),
                       StoreError);
  {
    RawConn raw(server.port());
    REQUIRE(raw.read_frame());
    wire::Request q;
    q.op = wire::Op::kSet;
    q.keys = {"sneaky"};
    q.values = {B("x")};
    raw.send(wire::encode_request(q));
    auto reply = raw.read_frame();
    REQUIRE(reply);
    CHECK(error_text(*reply).find("authentication required") != std::string::npos);
    CHECK(raw.closed_by_server());
  }
  still_serves(server, "s3cret-token");
  CHECK_FALSE(Client(server.client_options("s3cret-token")).check({"sneaky"}));
  std::string logged = log.str();
  CHECK(logged.find("refused 127.0.0.1:") != std::string::npos);
  CHECK(logged.find("wrong token") != std::string::npos);
  CHECK(logged.find("s3cret") == std::string::npos);
}

TEST_CASE("a replayed auth answer for another nonce is refused") {
  ServerOptions o;
  o.token = "t";
  ServerThread server(o);
  RawConn raw(server.port());
  auto g = raw.read_frame();
  REQUIRE(g);
  auto greeting = wire::parse_greeting(g->data(), g->size());
  REQUIRE(greeting);
  REQUIRE(greeting->auth_required);
  wire::Bytes other_nonce(wire::kNonceSize, 0);
  wire::Request q;
  q.op = wire::Op::kAuth;
  wire::Bytes mine(wire::kNonceSize, 1);
  q.values = {auth_mac("t", wire::kClientAuthLabel, other_nonce, mine), mine};
  raw.send(wire::encode_request(q));
  auto reply = raw.read_frame();
  REQUIRE(reply);
  CHECK(error_text(*reply).find("wrong token") != std::string::npos);
}

TEST_CASE("a silent unauthenticated connection is closed after the handshake window") {
  ServerOptions o;
  o.token = "t";
  o.handshake_timeout = 200ms;
  ServerThread server(o);
  RawConn raw(server.port());
  REQUIRE(raw.read_frame());
  CHECK(raw.closed_by_server());
}

TEST_CASE("connections beyond the limit are turned away") {
  ServerOptions o;
  o.max_connections = 2;
  ServerThread server(o);
  auto a = std::make_unique<Client>(server.client_options());
  Client b(server.client_options());
  auto opts = server.client_options();
  opts.connect_timeout = 300ms;
  // Without a token the refusal (closed before the greeting) is met by
  // the first call, which tries again until connect_timeout.
  CHECK_THROWS_WITH_AS(Client{opts}.ping(), doctest::Contains("cannot connect to store at 127.0.0.1:"),
                       StoreError);
  a.reset();
  REQUIRE(server.wait_for_state([](ServerThread& s) { return s.connections() == 1; }));
  Client c(server.client_options());
  c.ping();
}

TEST_CASE("the client reconnects after the server restarts on the same port") {
  auto server = std::make_unique<ServerThread>();
  uint16_t port = server->port();
  Client c(server->client_options());
  c.set("before", B("1"));
  REQUIRE(c.get("before", 1s) == B("1"));  // acknowledged: never sent again
  server.reset();  // closes every connection
  ServerOptions o;
  o.port = port;
  server = std::make_unique<ServerThread>(o);
  c.add("after", 2);  // not retried: the client finds the old connection dead first
  CHECK(c.get("after", 1s) == B("2"));
  CHECK_FALSE(c.check({"before"}));
}

TEST_CASE("a dead store is reported within the deadline, naming its address") {
  auto server = std::make_unique<ServerThread>();
  auto opts = server->client_options();
  opts.connect_timeout = 300ms;
  Client c(opts);
  server.reset();
  CHECK_THROWS_WITH_AS(c.ping(),
                       doctest::Contains(("127.0.0.1:" + std::to_string(opts.port)).c_str()), StoreError);
}

TEST_CASE("a store that served this client and now refuses is gone at once, not after connect_timeout") {
  // The store's host is up and nothing listens on the port (its agent
  // died): the survivors' failover must not wait out a reconnect window.
  auto server = std::make_unique<ServerThread>();
  auto opts = server->client_options();
  opts.connect_timeout = std::chrono::milliseconds(60000);
  Client c(opts);
  c.set("k", B("v"));
  REQUIRE(c.get("k", 1s) == B("v"));
  server.reset();
  // Only a refusal after a connection throws this; waiting out the minute
  // would end in a plain StoreError ("cannot connect ... within 60000 ms").
  CHECK_THROWS_WITH_AS(c.ping(), doctest::Contains("is gone: its host refuses connections"),
                       StoreGoneError);
  // A client that never reached its store still waits for it to come up.
  opts.connect_timeout = std::chrono::milliseconds(300);
  CHECK_THROWS_WITH_AS(Client{opts}, doctest::Contains("cannot connect"), StoreError);
}

TEST_CASE("sets whose acks were lost with the server are sent again after a restart") {
  auto server = std::make_unique<ServerThread>();
  uint16_t port = server->port();
  auto opts = server->client_options();
  Client c(opts);
  c.ping();
  server.reset();
  ServerOptions o;
  o.port = port;
  server = std::make_unique<ServerThread>(o);
  c.set("k", B("v"));  // goes into the dead connection first
  CHECK(c.get("k", 1s) == B("v"));
  CHECK(Client(opts).get("k", 1s) == B("v"));
}

TEST_CASE("an add after a set whose ack died with the server goes to the new server") {
  auto server = std::make_unique<ServerThread>();
  uint16_t port = server->port();
  Client c(server->client_options());
  c.set("unacked", B("1"));  // the old server may or may not have read it
  server.reset();
  ServerOptions o;
  o.port = port;
  server = std::make_unique<ServerThread>(o);
  CHECK(c.add("after", 2) == 2);  // not retry-safe, yet never sent to the dead connection
  CHECK(c.get("after", 1s) == B("2"));
}

TEST_CASE("a client that only sets is bounded by its unacknowledged window") {
  ServerThread server;
  Client c(server.client_options());
  for (int i = 0; i < 1000; ++i) c.set("k" + std::to_string(i), B(std::to_string(i)));
  CHECK(c.num_keys() == 1000);
  CHECK(c.get("k999", 1s) == B("999"));
}

TEST_CASE("a client that never reads its replies is closed; others are served") {
  ServerOptions o;
  o.partial_frame_timeout = 300ms;
  ServerThread server(o);
  {
    Client big(server.client_options());
    big.set("v", wire::Bytes(wire::kMaxValueSize));
    big.ping();
  }
  RawConn greedy(server.port());
  REQUIRE(greedy.read_frame());
  wire::Request q;
  q.op = wire::Op::kMultiGet;
  q.timeout_ms = 1000;
  q.keys = {"v", "v", "v"};
  // ~3 MiB per reply, far beyond the socket buffers; never read
  wire::Bytes f = wire::encode_request(q);
  for (int i = 0; i < 8; ++i) greedy.send(f);
  CHECK(server.wait_for_state([](ServerThread& s) { return s.connections() == 0; }, 20s));
  still_serves(server);
}

TEST_CASE("requests pipelined behind a blocked get are answered in order after it") {
  ServerThread server;
  RawConn raw(server.port());
  REQUIRE(raw.read_frame());
  wire::Request get;
  get.op = wire::Op::kGet;
  get.keys = {"k"};
  get.timeout_ms = 20000;
  wire::Request ping;
  ping.op = wire::Op::kPing;
  wire::Bytes both = wire::encode_request(get);
  wire::Bytes p = wire::encode_request(ping);
  both.insert(both.end(), p.begin(), p.end());
  raw.send(both);
  REQUIRE(server.wait_for_state([](ServerThread& s) { return s.waiters() == 1; }));
  Client(server.client_options()).set("k", B("value"));
  auto first = raw.read_frame();
  REQUIRE(first);
  REQUIRE(first->size() == 1 + 4 + 5);
  CHECK((*first)[0] == static_cast<uint8_t>(wire::Status::kOk));
  CHECK(std::string(first->begin() + 5, first->end()) == "value");
  auto second = raw.read_frame();
  REQUIRE(second);
  CHECK(*second == wire::Bytes{static_cast<uint8_t>(wire::Status::kOk)});
}

TEST_CASE("a lost greeting is retried on a new connection within connect_timeout") {
  // Issue 19: one greeting lost during formation killed a joining agent;
  // the client waited out its whole connect_timeout on that one connection.
  ServerOptions o;
  o.token = "t";
  ServerThread server(o);
  ddprun::rendezvous::testing::StallProxy proxy(server.port());
  proxy.mute_next_connections(2);  // two greetings in a row never arrive
  ClientOptions co = server.client_options("t");
  co.port = proxy.port();
  co.connect_timeout = std::chrono::seconds(120);
  Client c(co);  // would throw after 120 s, or never return sooner, without retries
  c.set("k", wire::Bytes{'v'});
  CHECK(c.get("k", std::chrono::seconds(10)) == wire::Bytes{'v'});
  CHECK(proxy.muted() == 2);
}

// The server reads by peeking and then dropping what it peeked (server_io.h):
// on TCP the drop copies nothing (MSG_TRUNC); a Unix socket ignores that flag
// and needs a real buffer. Frames small enough for the wait's own 256-byte
// peek and larger ones, pipelined in one write, on both kinds of socket.
namespace {
wire::Bytes frame(wire::Op op, const std::string& key, const wire::Bytes& value = {}) {
  wire::Request q;
  q.op = op;
  q.keys = {key};
  if (op == wire::Op::kSet) q.values = {value};
  if (op == wire::Op::kGet) q.timeout_ms = 5000;
  return wire::encode_request(q);
}

void set_get_rounds(RawConn& raw) {
  REQUIRE(raw.read_frame());  // greeting
  for (size_t size : {1, 64, 200, 300, 5000, 70000}) {
    const std::string key = "k" + std::to_string(size);
    const wire::Bytes value(size, static_cast<uint8_t>(size));
    wire::Bytes both = frame(wire::Op::kSet, key, value);
    wire::Bytes get = frame(wire::Op::kGet, key);
    both.insert(both.end(), get.begin(), get.end());
    raw.send(both);
    auto ack = raw.read_frame();
    REQUIRE(ack);
    CHECK((*ack)[0] == static_cast<uint8_t>(wire::Status::kOk));
    auto reply = raw.read_frame();
    REQUIRE(reply);
    wire::Reply r = wire::parse_reply(wire::Op::kGet, reply->data(), reply->size());
    INFO("value of " << size << " bytes");
    CHECK(r.status == wire::Status::kOk);
    CHECK(r.value == value);
  }
}
}  // namespace

TEST_CASE("pipelined frames below and above the read's peek size are answered in order") {
  ServerThread server;
  RawConn raw(server.port());
  set_get_rounds(raw);
  still_serves(server);
}

TEST_CASE("a Unix socket handed to the server with adopt() is served") {
  ServerThread server;
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  server.adopt(sv[0], "socketpair");
  RawConn raw(RawConn::Adopt{}, sv[1]);
  set_get_rounds(raw);
  CHECK(server.connections() == 1);
  still_serves(server);
}
