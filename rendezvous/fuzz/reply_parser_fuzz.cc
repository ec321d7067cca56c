// libFuzzer target for the client's side of the wire: reply payloads for
// every op (wire::parse_reply), greetings and frame headers. A decoded
// reply must be self-consistent; nothing may read out of bounds.
#include <cstdlib>

#include "rendezvous/wire.h"

using namespace ddprun::rendezvous;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  auto op = static_cast<wire::Op>(data[0] % 15);
  size_t expected = data[1] % 8;
  data += 2, size -= 2;
  wire::Reply r = wire::parse_reply(op, data, size, expected);
  if (!r.error.empty() && r.status != wire::Status::kError) abort();
  if (r.error.empty() && r.status == wire::Status::kOk && op == wire::Op::kMultiGet &&
      r.values.size() != expected) {
    abort();
  }
  if (r.error.empty() && r.status == wire::Status::kOk && op == wire::Op::kAuth &&
      r.value.size() != wire::kMacSize) {
    abort();
  }
  wire::parse_greeting(data, size);
  wire::frame_length(data, size);
  return 0;
}
