// libFuzzer target for the store's request parser and table.
//
// Feeds arbitrary bytes to wire::parse_request frame by frame, checks that
// every parsed request re-encodes to the bytes it came from, and executes
// it on a Table (blocking requests are parked and then cancelled), so the
// parser and the operations are fuzzed without sockets.
#include <cstdlib>
#include <cstring>
#include <memory>

#include "rendezvous/table.h"
#include "rendezvous/wire.h"

using namespace ddprun::rendezvous;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Table table(1 << 20);
  std::vector<std::unique_ptr<wire::Request>> parked_requests;
  std::vector<std::unique_ptr<Table::Waiter>> parked;
  size_t pos = 0;
  while (pos < size) {
    wire::ParseResult r = wire::parse_request(data + pos, size - pos);
    if (r.kind != wire::ParseResult::kOk) break;
    if (r.consumed == 0 || r.consumed > size - pos) abort();
    wire::Bytes again = wire::encode_request(r.request);
    if (again.size() != r.consumed || std::memcmp(again.data(), data + pos, r.consumed) != 0) {
      // Only clamped timeouts may differ from the input.
      if (r.request.timeout_ms != wire::kMaxTimeoutMs) abort();
    }
    pos += r.consumed;
    if (r.request.op == wire::Op::kAuth) continue;
    auto q = std::make_unique<wire::Request>(std::move(r.request));
    auto w = std::make_unique<Table::Waiter>();
    w->on_ready = [](const Table::Answer& a) {
      if (!a || a->size() < 5) abort();  // every answer has a header and a status
    };
    wire::Bytes out;
    if (!table.execute(*q, out, *w)) {
      parked_requests.push_back(std::move(q));
      parked.push_back(std::move(w));
    } else if (out.size() < 5) {
      abort();  // every answer has a header and a status
    }
  }
  for (auto& w : parked) table.cancel(*w);
  if (table.num_waiters() != 0) abort();
  return 0;
}
