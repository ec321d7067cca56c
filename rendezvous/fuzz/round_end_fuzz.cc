// libFuzzer target for the job protocol's records, the round end and the
// rank failure (rendezvous/job_protocol.h): any bytes either decode to a
// record that encodes back to exactly those bytes, or are refused with
// RecordError; nothing may read out of bounds.
#include <cstdlib>

#include "rendezvous/job_protocol.h"

using namespace ddprun::rendezvous;

namespace {

void round_end(const Bytes& in) {
  RoundEnd end;
  try {
    end = decode_round_end(in);
  } catch (const RecordError&) {
    return;
  }
  if (encode_round_end(end) != in) abort();  // one encoding per record
}

void rank_failure(const Bytes& in) {
  RankFailure failure;
  try {
    failure = decode_rank_failure(in);
  } catch (const RecordError&) {
    return;
  }
  if (encode_rank_failure(failure) != in) abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Bytes in(data, data + size);
  round_end(in);
  rank_failure(in);
  return 0;
}
