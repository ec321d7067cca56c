// The TCPStore queries on the store's table (rendezvous/tcpstore_executor.h),
// without sockets: appends grow a value in place within the table's budget,
// queues are charged to it and refunded, a full store refuses the write
// that overflows it, and waits are answered once, by the write that
// completes them, never after their connection cancelled them.
#include <doctest/doctest.h>

#include <string>

#include "rendezvous/table.h"
#include "rendezvous/tcpstore_executor.h"

using namespace ddprun::rendezvous;
namespace ts = ddprun::rendezvous::tcpstore;

namespace {

ts::Bytes bytes(const std::string& s) { return ts::Bytes(s.begin(), s.end()); }

ts::Request query(ts::Op op, std::vector<std::string> keys = {}, std::vector<std::string> values = {}) {
  ts::Request q;
  q.op = op;
  q.keys = std::move(keys);
  for (const auto& v : values) q.values.push_back(bytes(v));
  return q;
}

// One simulated connection: its waiter and the replies it received.
struct Peer {
  Peer() {
    waiter.on_ready = [this](const ts::Bytes& reply) {
      ++answered;
      out.insert(out.end(), reply.begin(), reply.end());
    };
  }
  // Runs `q`; the refusal when the connection would be closed, else "".
  std::string run(ts::Executor& e, ts::Request q) {
    std::string refusal;
    if (!e.execute(q, out, waiter, refusal)) e.cancel(waiter);
    return refusal;
  }
  ts::Executor::Waiter waiter;
  ts::Bytes out;
  int answered = 0;
};

// The string reply at the front of `out` (u64 length, bytes).
std::string string_reply(const ts::Bytes& out) {
  REQUIRE(out.size() >= 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | out[static_cast<size_t>(i)];
  REQUIRE(out.size() == 8 + n);
  return std::string(out.begin() + 8, out.end());
}

}  // namespace

TEST_CASE("a value appended to a thousand times holds every piece, charged with its capacity") {
  Table table(1 << 20);
  std::string expected;
  for (int i = 0; i < 1000; ++i) {
    const std::string piece = std::to_string(i) + ",";
    REQUIRE(table.append("/log", reinterpret_cast<const uint8_t*>(piece.data()), piece.size(),
                         64 * 1024) == Table::Write::kOk);
    expected += piece;
  }
  const ts::Bytes* v = table.find("/log");
  REQUIRE(v != nullptr);
  CHECK(std::string(v->begin(), v->end()) == expected);
  // Charged with what the value holds on the heap, grown geometrically:
  // at least its size, at most twice it.
  CHECK(table.bytes() == Table::entry_bytes(4, v->capacity()));
  CHECK(v->capacity() <= 2 * v->size());
  const std::string more(64 * 1024, 'x');
  CHECK(table.append("/log", reinterpret_cast<const uint8_t*>(more.data()), more.size(), 64 * 1024) ==
        Table::Write::kTooLarge);
  CHECK(table.find("/log")->size() == expected.size());  // unchanged
}

TEST_CASE("a full store refuses the write that overflows it; reads and smaller keys go on") {
  ts::Executor e(16 * 1024);
  Peer p;
  CHECK(p.run(e, query(ts::Op::kSet, {"/a"}, {"small"})).empty());
  std::string refusal;
  for (int i = 0; refusal.empty() && i < 100; ++i)
    refusal = p.run(e, query(ts::Op::kAppend, {"/big"}, {std::string(1000, 'x')}));
  CHECK(refusal.find("the store is full (16384 bytes)") != std::string::npos);
  CHECK(e.bytes() <= 16 * 1024);
  Peer q;
  CHECK(q.run(e, query(ts::Op::kGet, {"/a"})).empty());
  CHECK(string_reply(q.out) == "small");
  // Queued values are charged too, and refunded when popped.
  const size_t before = e.bytes();
  Peer r;
  CHECK(r.run(e, query(ts::Op::kDeleteKey, {"/big"})).empty());
  CHECK(e.bytes() < before);
  const size_t emptied = e.bytes();
  CHECK(r.run(e, query(ts::Op::kQueuePush, {"/q"}, {"item"})).empty());
  CHECK(e.bytes() > emptied);
  r.out.clear();
  CHECK(r.run(e, query(ts::Op::kQueuePop, {"/q"})).empty());
  CHECK(e.bytes() == emptied);
  e.clear();
  CHECK(e.bytes() == 0);
  CHECK(e.num_keys() == 0);
}

TEST_CASE("a barrier answers every arrival in the query that completes it, once") {
  ts::Executor e(1 << 20);
  Peer a, b, c;
  auto barrier = [] {
    auto q = query(ts::Op::kBarrier, {"/b"});
    q.number = 3;
    return q;
  };
  CHECK(a.run(e, barrier()).empty());
  CHECK(b.run(e, barrier()).empty());
  CHECK(a.answered == 0);
  CHECK(e.num_waiters() == 2);
  CHECK(c.run(e, barrier()).empty());
  CHECK(a.answered == 1);
  CHECK(b.answered == 1);
  CHECK(c.answered == 1);  // the last arrival too, in its own query
  CHECK(c.out == ts::Bytes{ts::kStopWaiting});
  CHECK(e.num_waiters() == 0);
  // A later write to the key answers no one again.
  CHECK(a.run(e, query(ts::Op::kSet, {"/b"}, {"0"})).empty());
  CHECK(a.answered + b.answered + c.answered == 3);
}

TEST_CASE("a cancelled wait is never answered; another's wait on the same key is") {
  ts::Executor e(1 << 20);
  Peer gone, waiting, writer;
  CHECK(gone.run(e, query(ts::Op::kWait, {"/k"})).empty());
  CHECK(waiting.run(e, query(ts::Op::kWait, {"/k", "/k2"})).empty());
  CHECK(e.num_waiters() == 2);
  e.cancel(gone.waiter);  // its connection closed
  CHECK(writer.run(e, query(ts::Op::kSet, {"/k"}, {"v"})).empty());
  CHECK(waiting.answered == 0);  // still waits for /k2
  CHECK(writer.run(e, query(ts::Op::kQueuePush, {"/k2"}, {"item"})).empty());
  CHECK(waiting.answered == 1);
  CHECK(gone.answered == 0);
  CHECK(e.num_waiters() == 0);
}
