// The server's memory and slot limits (wire.h, ServerOptions): what a
// client without the token may make it hold, the server-wide cap on
// buffered bytes, fair slots per peer address, and a log that a flood
// cannot fill. Limits are set small so each test is quick; the hostile
// suite (store_hostile_test.cc) runs the same attacks at full size against
// the real ddprun-store.
#include <doctest/doctest.h>
#include <spdlog/spdlog.h>

#include <sstream>

#include "rendezvous/server_limits.h"
#include "rendezvous/table.h"
#include "tests/rendezvous/test_util.h"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::testing;

namespace {

std::string error_text(const std::optional<wire::Bytes>& payload) {
  REQUIRE(payload);
  REQUIRE(!payload->empty());
  CHECK((*payload)[0] == static_cast<uint8_t>(wire::Status::kError));
  std::string message;
  wire::Reader r(payload->data() + 1, payload->size() - 1);
  r.str(message, wire::kMaxFrameSize);
  return message;
}

wire::Bytes header(uint32_t n) {
  return {static_cast<uint8_t>(n), static_cast<uint8_t>(n >> 8), static_cast<uint8_t>(n >> 16),
          static_cast<uint8_t>(n >> 24)};
}

// The first `size` bytes of a set frame whose value is `value_size` long.
wire::Bytes partial_set(size_t value_size, size_t size) {
  wire::Request q;
  q.op = wire::Op::kSet;
  q.keys = {"k"};
  q.values = {wire::Bytes(value_size, 7)};
  wire::Bytes f = wire::encode_request(q);
  f.resize(size);
  return f;
}

void still_serves(ServerThread& server, const std::string& token = "") {
  Client c(server.client_options(token));
  c.set("alive", B("yes"));
  CHECK(c.get("alive", 1s) == B("yes"));
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("before authentication a frame over the small limit is refused at its header") {
  ServerOptions o;
  o.token = "t";
  ServerThread server(o);
  RawConn raw(server.port());
  REQUIRE(raw.read_frame());
  raw.send(header(wire::kMaxFrameSize));  // a 4 MiB frame announced, none sent
  CHECK(error_text(raw.read_frame()).find("pre-authentication limit of 128") != std::string::npos);
  CHECK(raw.closed_by_server());
  CHECK(server.buffered() < 4096);
  still_serves(server, "t");
}

TEST_CASE("partial frames beyond the buffer limit close the biggest holder; others are served") {
  ServerOptions o;
  o.max_buffered_bytes = 3 << 20;
  o.partial_frame_timeout = 60s;  // the limit acts, not the slow-loris timer
  ServerThread server(o);
  std::vector<std::unique_ptr<RawConn>> loris;
  for (int i = 0; i < 4; ++i) {
    loris.push_back(std::make_unique<RawConn>(server.port(), "127.0.0.2"));
    REQUIRE(loris.back()->read_frame());
    loris.back()->send(partial_set(wire::kMaxValueSize, wire::kMaxValueSize / 2));
  }
  // Each parks a 1 MiB frame (reserved whole): four cannot all fit in 3 MiB.
  CHECK(server.wait_for_state([&](ServerThread& s) {
    return s.connections() < 4 && s.buffered() <= o.max_buffered_bytes;
  }));
  still_serves(server);
  CHECK(server.buffered() <= o.max_buffered_bytes);
}

namespace {
// A wait on 8,000 short keys that never appear: a 110 KiB frame, ~1.3 MiB
// in the table while blocked.
std::vector<std::string> never_keys(const std::string& tag) {
  std::vector<std::string> keys;
  for (int i = 0; i < 8000; ++i) keys.push_back(tag + "/" + std::to_string(i));
  return keys;
}
wire::Bytes never_wait(const std::string& tag) {
  wire::Request q;
  q.op = wire::Op::kWait;
  q.timeout_ms = 600000;
  q.keys = never_keys(tag);
  return wire::encode_request(q);
}
}  // namespace

TEST_CASE("a blocked wait is charged against the buffer limit") {
  ServerOptions o;
  o.max_buffered_bytes = 2 << 20;
  ServerThread server(o);
  wire::Bytes frame = never_wait("never");
  RawConn first(server.port(), "127.0.0.2");
  REQUIRE(first.read_frame());
  first.send(frame);
  REQUIRE(server.wait_for_state([](ServerThread& s) { return s.waiters() == 1; }));
  size_t charged = server.buffered();
  CHECK(charged > frame.size());
  RawConn second(server.port(), "127.0.0.2");
  REQUIRE(second.read_frame());
  second.send(never_wait("other"));
  // Two different ones cannot be held at once: one of them is closed, its
  // memory released.
  CHECK(server.wait_for_state([&](ServerThread& s) {
    return s.waiters() <= 1 && s.connections() == 1 && s.buffered() <= o.max_buffered_bytes;
  }));
  still_serves(server);
}

TEST_CASE("waiters asking the same keys share one registration, so a hundred fit where two different ones do not") {
  ServerOptions o;
  o.max_buffered_bytes = 2 << 20;
  ServerThread server(o);
  wire::Bytes frame = never_wait("never");
  std::vector<std::unique_ptr<RawConn>> same;
  for (size_t i = 0; i < 100; ++i) {
    same.push_back(std::make_unique<RawConn>(server.port(), "127.0.0.2"));
    REQUIRE(same.back()->read_frame());
    same.back()->send(frame);
    // One frame in flight at a time: the limit is about the blocked ones.
    REQUIRE(server.wait_for_state([&](ServerThread& s) { return s.waiters() == i + 1; }));
  }
  CHECK(server.connections() == 100);
  CHECK(server.buffered() <= o.max_buffered_bytes);
  // The keys appear: every one of them is answered.
  {
    Client c(server.client_options());
    std::vector<std::string> keys = never_keys("never");
    c.multi_set(keys, std::vector<wire::Bytes>(keys.size(), wire::Bytes{'v'}));
    c.ping();
  }
  for (auto& r : same) {
    auto reply = r->read_frame();
    REQUIRE(reply);
    CHECK((*reply)[0] == static_cast<uint8_t>(wire::Status::kOk));
  }
  CHECK(server.waiters() == 0);
}

TEST_CASE("clients that do not read their replies get one built each and are closed at the limit") {
  ServerOptions o;
  o.max_buffered_bytes = 4 << 20;
  o.partial_frame_timeout = 60s;  // the limit acts, not the unread-reply timer
  ServerThread server(o);
  {
    Client big(server.client_options());
    big.set("v", wire::Bytes(wire::kMaxValueSize));
    big.ping();
  }
  wire::Request q;
  q.op = wire::Op::kMultiGet;
  q.timeout_ms = 1000;
  q.keys = {"v", "v", "v"};
  wire::Bytes f = wire::encode_request(q);
  std::vector<std::unique_ptr<RawConn>> greedy;
  for (int c = 0; c < 3; ++c) {
    greedy.push_back(std::make_unique<RawConn>(server.port(), "127.0.0.2"));
    REQUIRE(greedy.back()->read_frame());
    for (int i = 0; i < 16; ++i) greedy.back()->send(f);  // ~48 MiB of replies, never read
  }
  // One ~3 MiB reply each is built (the kernel takes part of it); three do
  // not fit in 4 MiB, so the biggest holders are closed until they do.
  CHECK(server.wait_for_state([&](ServerThread& s) {
    return s.connections() < 3 && s.buffered() <= o.max_buffered_bytes;
  }, 20s));
  CHECK(server.buffered() <= o.max_buffered_bytes);
  still_serves(server);
}

TEST_CASE("one peer address cannot take every connection slot") {
  LogCapture log;
  ServerOptions o;
  o.max_connections_per_peer = 3;
  ServerThread server(o);
  std::vector<std::unique_ptr<RawConn>> flood;
  for (int i = 0; i < 3; ++i) {
    flood.push_back(std::make_unique<RawConn>(server.port(), "127.0.0.2"));
    REQUIRE(flood.back()->read_frame());
  }
  RawConn extra(server.port(), "127.0.0.2");
  CHECK(extra.closed_by_server());
  still_serves(server);  // from 127.0.0.1
  CHECK(log.str().find("refusing a connection from 127.0.0.2: 3 connections from one address") !=
        std::string::npos);
}

TEST_CASE("connections that have not authenticated are capped per peer and in all; a newcomer evicts the biggest holder's oldest") {
  ServerOptions o;
  o.token = "t";
  o.max_unauthenticated_per_peer = 2;
  o.max_unauthenticated = 3;
  ServerThread server(o);
  RawConn a1(server.port(), "127.0.0.2"), a2(server.port(), "127.0.0.2");
  REQUIRE(a1.read_frame());
  REQUIRE(a2.read_frame());
  RawConn a3(server.port(), "127.0.0.2");
  CHECK(a3.closed_by_server());  // the third silent one from .2
  RawConn b1(server.port(), "127.0.0.3");
  REQUIRE(b1.read_frame());  // another peer still gets in; three is the total
  RawConn c1(server.port(), "127.0.0.4");
  CHECK(c1.read_frame());         // full, but .2 holds two: its oldest goes
  CHECK(a1.closed_by_server());
  RawConn c2(server.port(), "127.0.0.4");
  CHECK(c2.closed_by_server());  // everyone holds one now: nobody is evicted for .4's second
  b1.send(header(1000));         // b1 misbehaves and is closed: its slot comes back
  REQUIRE(b1.closed_by_server());
  REQUIRE(server.wait_for_state([](ServerThread& s) { return s.connections() == 2; }));
  // An authenticated connection gives its slot back once it has proved the token.
  Client good(server.client_options("t"));
  good.ping();
  RawConn c3(server.port(), "127.0.0.5");
  CHECK(c3.read_frame());
  good.ping();
}

TEST_CASE("connections that have not authenticated are capped per /24, the biggest holder giving way") {
  ServerOptions o;
  o.token = "t";
  o.max_unauthenticated_per_subnet = 2;
  ServerThread server(o);
  RawConn a(server.port(), "127.0.5.2"), b(server.port(), "127.0.5.3");
  REQUIRE(a.read_frame());
  REQUIRE(b.read_frame());
  // A third address of the same /24 takes the place of one of the two
  // (each holds more than its none): an attacker sharing a good client's
  // /24 cannot lock it out by filling the subnet's share.
  RawConn c(server.port(), "127.0.5.4");
  CHECK(c.read_frame());
  REQUIRE(server.wait_for_state([](ServerThread& s) { return s.connections() == 2; }));
  // Its second connection evicts nobody: no address holds more than it.
  RawConn c2(server.port(), "127.0.5.4");
  CHECK(c2.closed_by_server());
  RawConn d(server.port(), "127.0.6.2");
  CHECK(d.read_frame());  // another /24 still gets in
  Client good(server.client_options("t"));
  good.ping();
}

TEST_CASE("a flood of refused connections is logged as a count a second, not a line each") {
  LogCapture log;
  ServerOptions o;
  o.max_connections_per_peer = 1;
  ServerThread server(o);
  RawConn holder(server.port(), "127.0.0.2");
  REQUIRE(holder.read_frame());
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 300; ++i) {
    RawConn refused(server.port(), "127.0.0.2");
    CHECK(refused.closed_by_server());
  }
  auto seconds = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start).count();
  std::string text;
  auto deadline = std::chrono::steady_clock::now() + 5s;
  do {  // the count line follows within a second of the flood
    text = log.str();
  } while (text.find("more warnings") == std::string::npos && std::chrono::steady_clock::now() < deadline);
  CHECK(text.find("more warnings like the above in the last second") != std::string::npos);
  size_t lines = count(text, "\n");
  CHECK(lines <= (static_cast<size_t>(seconds) + 2) * (RateLimitedLog::kVerbatimPerSecond + 1));
  still_serves(server);
}

TEST_CASE("the key budget charges each entry with its real bookkeeping") {
  // A tiny key and value still cost a map node, a bucket and a chunk.
  CHECK(Table::entry_bytes(8, 8) >= 128);
  CHECK(Table::entry_bytes(100, 1000) >= 100 + 1000 + 96);
  ServerOptions o;
  o.max_store_bytes = 1 << 20;
  ServerThread server(o);
  Client c(server.client_options());
  int64_t stored = 0;
  try {
    for (int i = 0;; ++i) {
      c.set("k" + std::to_string(i), B("v"));
      if (i % 256 == 0) c.ping();  // collects the refusal of a set, if any
      stored = i + 1;
    }
  } catch (const StoreError& e) {
    CHECK(std::string(e.what()).find("store full") != std::string::npos);
  }
  int64_t keys = c.num_keys();
  CHECK(keys < stored + 1);
  CHECK(static_cast<size_t>(keys) * Table::entry_bytes(6, 1) <= o.max_store_bytes);
  CHECK(static_cast<size_t>(keys) * Table::entry_bytes(6, 1) > o.max_store_bytes - 1024);
}
