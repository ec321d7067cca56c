// libFuzzer target for the TCPStore protocol every worker speaks on
// MASTER_PORT: the codec (tcpstore_codec.h) and the executor on the table
// (tcpstore_executor.h), without sockets.
//
// The input is one byte stream in the dialect its first bytes show, as a
// connection's would be. Each parsed query must re-encode to the bytes it
// came from and is executed for one of three simulated connections in
// turn, so waits of one are answered by writes of another; every reply
// must have the shape its query's reply has (tcpstore_codec.h). A refused
// query closes its connection (its wait cancelled, a fresh one takes its
// place). At the end every wait is cancelled and the table emptied, and
// nothing may be left behind: no waiter, no key, no byte charged.
#include <cstdlib>
#include <cstring>

#include "rendezvous/tcpstore_codec.h"
#include "rendezvous/tcpstore_executor.h"

using namespace ddprun::rendezvous::tcpstore;

namespace {

constexpr size_t kMaxStoreBytes = 8 * 1024;  // small: the full-store paths run too

struct Connection {
  Executor::Waiter waiter;
  Bytes out;             // the replies to its latest query
  bool waiting = false;  // blocked in WAIT or BARRIER
  size_t answered = 0;   // waits answered through on_ready
};

uint64_t u64_at(const Bytes& b, size_t at) {
  if (at + 8 > b.size()) abort();
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | b[at + static_cast<size_t>(i)];
  return v;
}

// The length of the string reply at `at`, which must fit in `b`.
size_t string_at(const Bytes& b, size_t at) {
  uint64_t n = u64_at(b, at);
  if (n > b.size() - at - 8) abort();
  return 8 + static_cast<size_t>(n);
}

// Checks that `reply` is exactly what `q` answers (WAIT and BARRIER: what
// they answer at once, the rest comes through on_ready).
void check_reply(const Request& q, const Bytes& reply) {
  size_t at = 0;
  switch (q.op) {
    case Op::kValidate:
    case Op::kSet:
    case Op::kAppend:
    case Op::kMultiSet:
    case Op::kQueuePush:
    case Op::kBarrier:
      break;
    case Op::kPing:
      at = 4;
      break;
    case Op::kCompareSet:
    case Op::kGet:
      at = string_at(reply, 0);
      break;
    case Op::kAdd:
    case Op::kGetNumKeys:
    case Op::kDeleteKey:
    case Op::kQueueLen:
      at = 8;
      break;
    case Op::kCheck:
    case Op::kCancelWait:
      at = 1;
      if (reply.size() != 1 || reply[0] > 1) abort();
      break;
    case Op::kWait:
      at = reply.size();
      if (at > 1 || (at == 1 && reply[0] != kStopWaiting)) abort();
      break;
    case Op::kMultiGet:
      for (size_t i = 0; i < q.keys.size(); ++i) at += string_at(reply, at);
      break;
    case Op::kQueuePop:
      at = 8;
      if (u64_at(reply, 0) > 0) at += string_at(reply, 8);
      break;
    case Op::kListKeys:
      at = 8;
      for (uint64_t i = 0, n = u64_at(reply, 0); i < n; ++i) at += string_at(reply, at);
      break;
    case Op::kWatchKey:
      abort();  // always refused
  }
  if (at != reply.size()) abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Dialect dialect = detect_dialect(data, size);
  if (dialect == Dialect::kUnknown) return 0;
  Executor executor(kMaxStoreBytes);
  Connection conns[3];
  for (auto& c : conns) {
    c.waiter.on_ready = [&c](const Bytes& reply) {
      if (reply != Bytes{kStopWaiting} || !c.waiting) abort();
      c.waiting = false;
      ++c.answered;
    };
  }
  size_t pos = 0;
  for (size_t turn = 0; pos < size; ++turn) {
    ParseResult r = parse_request(dialect, data + pos, size - pos);
    if (r.kind == ParseResult::kError) break;
    if (r.kind == ParseResult::kNeedMore) {
      if (r.need <= size - pos || r.need > kMaxFrameSize) abort();
      break;
    }
    if (r.consumed == 0 || r.consumed > size - pos) abort();
    const Bytes again = encode_request(dialect, r.request);
    if (again.size() != r.consumed || std::memcmp(again.data(), data + pos, r.consumed) != 0)
      abort();
    pos += r.consumed;
    Connection& c = conns[turn % 3];
    c.out.clear();
    const Op op = r.request.op;
    // A new wait replaces the old one; CANCEL_WAIT drops it.
    if (op == Op::kWait || op == Op::kBarrier || op == Op::kCancelWait) c.waiting = false;
    // The barrier's arrival is registered before it counts, so it may be
    // answered during its own query.
    if (op == Op::kBarrier) c.waiting = true;
    std::string refusal;
    if (!executor.execute(r.request, c.out, c.waiter, refusal)) {
      if (refusal.empty()) abort();
      executor.cancel(c.waiter);  // the server closes the connection
      c.waiting = false;
      continue;
    }
    if (executor.bytes() > kMaxStoreBytes) abort();
    check_reply(r.request, c.out);  // only the values were moved out
    if (op == Op::kWait && c.out.empty()) c.waiting = true;
  }
  for (auto& c : conns) executor.cancel(c.waiter);
  if (executor.num_waiters() != 0) abort();
  executor.clear();
  if (executor.num_keys() != 0 || executor.bytes() != 0) abort();
  return 0;
}
