// libFuzzer target for the watchdog's guard record (watchdog/guard_record.h),
// which the nodes of a job read from each other through the store: any
// bytes either decode to a record that encodes back to exactly those
// bytes, or are refused with RecordError; nothing may read out of bounds.
#include <cstdlib>

#include "rendezvous/record.h"
#include "watchdog/guard_record.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> in(data, data + size);
  ddprun::watchdog::NodeGuards g;
  try {
    g = ddprun::watchdog::decode_guards(1, in);
  } catch (const ddprun::rendezvous::RecordError&) {
    return 0;
  }
  if (ddprun::watchdog::encode_guards(g.seq, g.record) != in) abort();  // one encoding per record
  return 0;
}
