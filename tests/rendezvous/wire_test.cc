// The wire format alone: encode/parse round trips, truncation, limits.
#include <doctest/doctest.h>

#include "rendezvous/wire.h"

using namespace ddprun::rendezvous;
using wire::Op;
using wire::ParseResult;
using wire::Request;

namespace {
Request req(Op op, std::vector<std::string> keys = {}, std::vector<wire::Bytes> values = {}) {
  Request q;
  q.op = op;
  q.keys = std::move(keys);
  q.values = std::move(values);
  return q;
}

std::vector<Request> one_of_each() {
  std::vector<Request> all;
  all.push_back(req(Op::kAuth, {}, {wire::Bytes(wire::kMacSize, 7), wire::Bytes(wire::kNonceSize, 9)}));
  all.push_back(req(Op::kSet, {"k"}, {{1, 2, 3}}));
  Request g = req(Op::kGet, {"key"});
  g.timeout_ms = 1234;
  all.push_back(g);
  Request a = req(Op::kAdd, {"ctr"});
  a.delta = -42;
  all.push_back(a);
  all.push_back(req(Op::kCompareSet, {"c"}, {{}, {9}}));
  Request w = req(Op::kWait, {"a", "b", ""});
  w.timeout_ms = 5;
  all.push_back(w);
  all.push_back(req(Op::kCheck, {"a"}));
  all.push_back(req(Op::kDelete, {"d"}));
  all.push_back(req(Op::kNumKeys));
  all.push_back(req(Op::kAppend, {"l"}, {{0, 0}}));
  Request m = req(Op::kMultiGet, {"x", "y"});
  m.timeout_ms = 99;
  all.push_back(m);
  all.push_back(req(Op::kMultiSet, {"x", "y"}, {{1}, {}}));
  all.push_back(req(Op::kPing));
  Request oc = req(Op::kOnClose, {"end", "dead"}, {{1}, {2}});
  oc.counter = "restarts";
  all.push_back(oc);
  all.push_back(req(Op::kOnClose));  // cancel: no pairs
  return all;
}

ParseResult parse(const wire::Bytes& b) { return wire::parse_request(b.data(), b.size()); }

wire::Bytes frame(std::initializer_list<uint8_t> payload) {
  wire::Bytes out;
  {
    wire::Writer w(out);
    for (uint8_t b : payload) w.u8(b);
  }
  return out;
}
}  // namespace

TEST_CASE("every request round-trips through encode and parse") {
  for (const Request& q : one_of_each()) {
    CAPTURE(wire::op_name(q.op));
    wire::Bytes bytes = wire::encode_request(q);
    ParseResult r = parse(bytes);
    REQUIRE(r.kind == ParseResult::kOk);
    CHECK(r.consumed == bytes.size());
    CHECK(r.request.op == q.op);
    CHECK(r.request.keys == q.keys);
    CHECK(r.request.values == q.values);
    CHECK(r.request.delta == q.delta);
    CHECK(r.request.timeout_ms == q.timeout_ms);
    CHECK(r.request.counter == q.counter);
  }
}

TEST_CASE("every strict prefix of a frame asks for more bytes") {
  for (const Request& q : one_of_each()) {
    wire::Bytes bytes = wire::encode_request(q);
    for (size_t n = 0; n < bytes.size(); ++n) {
      CAPTURE(n);
      CHECK(wire::parse_request(bytes.data(), n).kind == ParseResult::kNeedMore);
    }
  }
}

TEST_CASE("two frames back to back parse one at a time") {
  wire::Bytes a = wire::encode_request(req(Op::kPing));
  wire::Bytes b = wire::encode_request(req(Op::kDelete, {"zz"}));
  wire::Bytes both = a;
  both.insert(both.end(), b.begin(), b.end());
  ParseResult r1 = parse(both);
  REQUIRE(r1.kind == ParseResult::kOk);
  CHECK(r1.request.op == Op::kPing);
  ParseResult r2 = wire::parse_request(both.data() + r1.consumed, both.size() - r1.consumed);
  REQUIRE(r2.kind == ParseResult::kOk);
  CHECK(r2.request.keys == std::vector<std::string>{"zz"});
}

TEST_CASE("a frame length over the limit is refused from its header alone") {
  wire::Bytes header = {0xff, 0xff, 0xff, 0xff};
  ParseResult r = parse(header);
  REQUIRE(r.kind == ParseResult::kError);
  CHECK(r.error.find("exceeds the limit") != std::string::npos);
}

TEST_CASE("malformed requests name what is wrong") {
  SUBCASE("unknown opcode") {
    ParseResult r = parse(frame({200}));
    REQUIRE(r.kind == ParseResult::kError);
    CHECK(r.error == "unknown opcode 200");
  }
  SUBCASE("empty frame") { CHECK(parse(frame({})).kind == ParseResult::kError); }
  SUBCASE("key longer than the limit") {
    Request q = req(Op::kSet, {std::string(wire::kMaxKeySize + 1, 'k')}, {{1}});
    ParseResult r = parse(wire::encode_request(q));
    REQUIRE(r.kind == ParseResult::kError);
    CHECK(r.error.find("key longer than 4096") != std::string::npos);
  }
  SUBCASE("value longer than the limit") {
    Request q = req(Op::kSet, {"k"}, {wire::Bytes(wire::kMaxValueSize + 1)});
    ParseResult r = parse(wire::encode_request(q));
    REQUIRE(r.kind == ParseResult::kError);
    CHECK(r.error.find("value longer than") != std::string::npos);
  }
  SUBCASE("too many keys") {
    Request q = req(Op::kCheck);
    q.keys.assign(wire::kMaxKeysPerRequest + 1, "k");
    ParseResult r = parse(wire::encode_request(q));
    REQUIRE(r.kind == ParseResult::kError);
    CHECK(r.error.find("key count 8193") != std::string::npos);
  }
  SUBCASE("key count larger than the frame can hold") {
    // count 8000 in a frame with room for none: refused before any allocation
    ParseResult r = parse(frame({static_cast<uint8_t>(Op::kCheck), 0x40, 0x1f, 0, 0}));
    REQUIRE(r.kind == ParseResult::kError);
  }
  SUBCASE("string length pointing past the frame") {
    ParseResult r = parse(frame({static_cast<uint8_t>(Op::kDelete), 10, 0, 0, 0, 'a'}));
    REQUIRE(r.kind == ParseResult::kError);
  }
  SUBCASE("trailing bytes") {
    ParseResult r = parse(frame({static_cast<uint8_t>(Op::kPing), 1}));
    REQUIRE(r.kind == ParseResult::kError);
    CHECK(r.error == "ping: 1 trailing bytes");
  }
  SUBCASE("auth mac of the wrong size") {
    ParseResult r = parse(wire::encode_request(req(Op::kAuth, {}, {{1, 2}, wire::Bytes(32)})));
    CHECK(r.kind == ParseResult::kError);
    CHECK(r.error.find("32-byte mac") != std::string::npos);
  }
  SUBCASE("auth without the client's nonce") {
    ParseResult r = parse(wire::encode_request(req(Op::kAuth, {}, {wire::Bytes(32), {1}})));
    CHECK(r.kind == ParseResult::kError);
    CHECK(r.error.find("32-byte nonce") != std::string::npos);
  }
}

TEST_CASE("blocking timeouts beyond the maximum are clamped") {
  Request g = req(Op::kGet, {"k"});
  g.timeout_ms = UINT64_MAX;
  ParseResult r = parse(wire::encode_request(g));
  REQUIRE(r.kind == ParseResult::kOk);
  CHECK(r.request.timeout_ms == wire::kMaxTimeoutMs);
}

TEST_CASE("greeting round-trips and rejects other protocols") {
  wire::Greeting g;
  g.auth_required = true;
  g.nonce = wire::Bytes(wire::kNonceSize, 0xab);
  wire::Bytes f = wire::encode_greeting(g);
  auto back = wire::parse_greeting(f.data() + 4, f.size() - 4);
  REQUIRE(back);
  CHECK(back->auth_required);
  CHECK(back->nonce == g.nonce);
  f[4] = 'X';
  CHECK_FALSE(wire::parse_greeting(f.data() + 4, f.size() - 4));
}

TEST_CASE("replies are decoded by the op they answer; malformed ones are named") {
  auto reply = [](Op op, const wire::Bytes& payload, size_t n = 0) {
    return wire::parse_reply(op, payload.data(), payload.size(), n);
  };
  CHECK(reply(Op::kGet, {0, 2, 0, 0, 0, 'h', 'i'}).value == wire::Bytes{'h', 'i'});
  CHECK(reply(Op::kAdd, {0, 5, 0, 0, 0, 0, 0, 0, 0}).number == 5);
  CHECK(reply(Op::kCheck, {0, 1}).flag);
  CHECK(reply(Op::kMultiGet, {0, 1, 0, 0, 0, 1, 0, 0, 0, 'x'}, 1).values.size() == 1);
  CHECK(reply(Op::kGet, {1}).status == wire::Status::kTimeout);
  CHECK(reply(Op::kSet, {2, 3, 0, 0, 0, 'b', 'a', 'd'}).message == "bad");
  // wrong shapes
  CHECK(reply(Op::kGet, {}).error == "empty reply");
  CHECK(reply(Op::kGet, {7}).error == "unknown status 7");
  CHECK(reply(Op::kAdd, {0, 1}).error == "malformed reply to add");
  CHECK(reply(Op::kCheck, {0, 2}).error == "malformed reply to check");
  CHECK(reply(Op::kSet, {1}).error == "malformed reply to set");  // only blocking ops time out
  CHECK(reply(Op::kPing, {0, 0}).error == "malformed reply to ping");  // trailing byte
  CHECK(reply(Op::kMultiGet, {0, 2, 0, 0, 0}, 1).error == "malformed reply to multi_get");
  CHECK(reply(Op::kAuth, {0, 1, 0, 0, 0, 9}).error == "malformed reply to auth");  // short mac
}

TEST_CASE("a c10d TCPStore client's opening bytes are recognised, a ddprun frame's are not") {
  namespace w = ddprun::rendezvous::wire;
  // torch >= 2: VALIDATE (0), then the u32 magic 0x3C85F7CE little-endian.
  const uint8_t validate[] = {0x00, 0xCE, 0xF7, 0x85, 0x3C};
  CHECK(w::is_tcpstore_hello(validate, sizeof validate));
  CHECK(w::is_tcpstore_hello(validate, 4));
  CHECK_FALSE(w::is_tcpstore_hello(validate, 3));  // not yet known
  const uint8_t ddprun_frame[] = {0x05, 0x00, 0x00, 0x00, 0x0B};
  CHECK_FALSE(w::is_tcpstore_hello(ddprun_frame, sizeof ddprun_frame));
}
