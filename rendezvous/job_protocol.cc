// The RoundEnd, RankFailure and Formed records (job_protocol.h has their
// fields), on record.h's codec. Depends on nothing but the standard library,
// record.cc and the header-only base/recovery_wire.h, so the fuzzer builds
// it alone.
#include "rendezvous/job_protocol.h"

#include "rendezvous/rendezvous_error.h"

namespace ddprun::rendezvous {
namespace {

constexpr RecordKind kRoundEndRecord{"round end record", {'D', 'R', 'E'}, kRoundEndVersion};
// magic, version, kind, status, signal, flags
constexpr size_t kRoundEndHeader = 3 + 1 + 1 + 1 + 1 + 1;
constexpr uint8_t kStoreCloses = 1;
constexpr uint8_t kForwardSignal = 2;
constexpr uint8_t kKnownFlags = kStoreCloses | kForwardSignal;

constexpr RecordKind kRankFailureRecord{"rank failure record", {'D', 'R', 'F'}, kRankFailureVersion};
// magic, version, cause, generation, rank count
constexpr size_t kRankFailureHeader = 3 + 1 + 1 + 4 + 2;

constexpr RecordKind kFormedRecord{"round formed record", {'D', 'R', 'C'}, 1};
constexpr size_t kFormedHeader = 3 + 1 + 8 + 8;  // magic, version, size, closer

bool known_cause(uint8_t c) { return c == RankFailure::kExit || c == RankFailure::kHang; }

// The limits a RankFailure's fields keep (encode and decode alike); throws
// RecordError naming the first one broken.
void check_failure(int64_t generation, const std::vector<int>& ranks) {
  if (generation < 0 || generation > kMaxGeneration)
    throw RecordError("rank failure record: generation " + std::to_string(generation) +
                      " is outside 0.." + std::to_string(kMaxGeneration));
  if (ranks.empty() || ranks.size() > kMaxFailedRanks)
    throw RecordError("rank failure record: " + std::to_string(ranks.size()) +
                      " ranks, it holds 1.." + std::to_string(kMaxFailedRanks));
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= kMaxFailedRank)
      throw RecordError("rank failure record: rank " + std::to_string(ranks[i]) +
                        " is outside 0.." + std::to_string(kMaxFailedRank - 1));
    // Ascending and unique: one spelling per set, so two writers of the
    // same failure write the same bytes.
    if (i > 0 && ranks[i] <= ranks[i - 1])
      throw RecordError("rank failure record: ranks not ascending at " + std::to_string(ranks[i]));
  }
}

bool known_kind(uint8_t k) { return k >= RoundEnd::kFailed && k <= RoundEnd::kSignalled; }

}  // namespace

const char* kind_name(RoundEnd::Kind kind) {
  switch (kind) {
    case RoundEnd::kFailed: return "failed";
    case RoundEnd::kScaleUp: return "scale-up";
    case RoundEnd::kPeerDead: return "peer-dead";
    case RoundEnd::kStoreLost: return "store-lost";
    case RoundEnd::kSignalled: return "signalled";
  }
  return "unknown";
}

Bytes encode_round_end(const RoundEnd& end) {
  if (!known_kind(end.kind))
    throw RecordError("round end record: unknown kind " + std::to_string(int(end.kind)));
  if (end.exit_status < 0 || end.exit_status > 255)
    throw RecordError("round end record: exit status " + std::to_string(end.exit_status) +
                      " is outside 0..255");
  if (end.signal < 0 || end.signal > 255)
    throw RecordError("round end record: signal " + std::to_string(end.signal) + " is outside 0..255");
  return RecordWriter(kRoundEndRecord)
      .u8(end.kind)
      .u8(static_cast<uint8_t>(end.exit_status))
      .u8(static_cast<uint8_t>(end.signal))
      .u8(static_cast<uint8_t>((end.store_closes ? kStoreCloses : 0) |
                               (end.forward_signal ? kForwardSignal : 0)))
      .text(end.node, kMaxEndNode)
      .text(end.reason, kMaxEndReason)
      .take();
}

RoundEnd decode_round_end(const Bytes& in) {
  RecordReader r(in, kRoundEndRecord, kRoundEndHeader);
  const uint8_t kind = r.u8("kind");
  if (!known_kind(kind)) r.fail("unknown kind " + std::to_string(kind));
  RoundEnd end;
  end.kind = static_cast<RoundEnd::Kind>(kind);
  end.exit_status = r.u8("exit status");
  end.signal = r.u8("signal");
  const uint8_t flags = r.u8("flags");
  if (flags & ~kKnownFlags) r.fail("unknown flags " + std::to_string(flags));
  end.store_closes = flags & kStoreCloses;
  end.forward_signal = flags & kForwardSignal;
  end.node = r.text(kMaxEndNode, "node id");
  end.reason = r.text(kMaxEndReason, "reason");
  r.finish();
  return end;
}


const char* cause_name(RankFailure::Cause cause) {
  return cause == RankFailure::kHang ? "hang" : "exit";
}

Bytes encode_rank_failure(const RankFailure& f) {
  if (!known_cause(f.cause))
    throw RecordError("rank failure record: unknown cause " + std::to_string(int(f.cause)));
  check_failure(f.generation, f.ranks);
  RecordWriter w(kRankFailureRecord);
  w.u8(f.cause).u32(static_cast<uint32_t>(f.generation)).count(f.ranks.size(), kMaxFailedRanks, "ranks");
  for (int r : f.ranks) w.u32(static_cast<uint32_t>(r));
  return w.text(f.node, kMaxEndNode).take();
}

RankFailure decode_rank_failure(const Bytes& in) {
  RecordReader r(in, kRankFailureRecord, kRankFailureHeader);
  const uint8_t cause = r.u8("cause");
  if (!known_cause(cause)) r.fail("unknown cause " + std::to_string(cause));
  RankFailure f;
  f.cause = static_cast<RankFailure::Cause>(cause);
  f.generation = r.u32("generation");
  const size_t count = r.count(kMaxFailedRanks, 4, "ranks");
  // Clamped so that a huge u32 reads as out of range, not as a negative int.
  for (size_t i = 0; i < count; ++i)
    f.ranks.push_back(static_cast<int>(std::min<uint32_t>(r.u32("ranks"), kMaxFailedRank)));
  check_failure(f.generation, f.ranks);
  f.node = r.text(kMaxEndNode, "node id");
  r.finish();
  return f;
}

Bytes encode_formed(const Formed& f) {
  return RecordWriter(kFormedRecord).i64(f.size).i64(f.closer).take();
}

Formed decode_formed(const Bytes& b, const std::string& key) {
  Formed f;
  try {
    RecordReader r(b, kFormedRecord, kFormedHeader);
    f.size = r.i64("size");
    f.closer = r.i64("closer");
    r.finish();
    if (f.size < 0) r.fail("size " + std::to_string(f.size));
  } catch (const RecordError& e) {
    throw RendezvousError("rendezvous: " + key + ": " + e.what());
  }
  return f;
}

}  // namespace ddprun::rendezvous
