// libFuzzer target for the records the agents of a job leave each other in
// the store, all on rendezvous/record.h's codec: the round end, the rank
// failure and the round formed (rendezvous/job_protocol.h), and the node,
// members and assignment records (rendezvous.h); the watchdog's guard
// record has its own target (watchdog/fuzz/), above this layer. Any bytes either
// decode to a record that encodes back to exactly those bytes, or are
// refused with RecordError; nothing may read out of bounds.
#include <cstdlib>

#include "rendezvous/job_protocol.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/rendezvous_error.h"

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

void formed(const Bytes& in) {
  Formed f;
  try {
    f = decode_formed(in, "r0/closed");
  } catch (const RendezvousError&) {
    return;
  }
  if (encode_formed(f) != in) abort();
}

void round_records(const Bytes& in) {
  if (auto n = decode_node(in); n && encode_node(*n) != in) abort();
  if (auto a = decode_assignment(in); a && encode_assignment(*a) != in) abort();
  // Every well-formed members record has at least its count.
  if (auto m = decode_nodes(in); !m.empty() && encode_nodes(m) != in) abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Bytes in(data, data + size);
  round_end(in);
  rank_failure(in);
  formed(in);
  round_records(in);
  return 0;
}
