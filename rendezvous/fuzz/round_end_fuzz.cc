// libFuzzer target for the job protocol's round end record
// (rendezvous/job_protocol.h): any bytes either decode to a record that
// encodes back to exactly those bytes, or are refused with RecordError;
// nothing may read out of bounds.
#include <cstdlib>

#include "rendezvous/job_protocol.h"

using namespace ddprun::rendezvous;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Bytes in(data, data + size);
  RoundEnd end;
  try {
    end = decode_round_end(in);
  } catch (const RecordError&) {
    return 0;
  }
  if (encode_round_end(end) != in) abort();  // one encoding per record
  return 0;
}
