// The RoundEnd and RankFailure codecs (job_protocol.h has the byte
// layouts). Depends on nothing but the standard library and the header-only
// base/recovery_wire.h, so the fuzzer builds it alone.
#include "rendezvous/job_protocol.h"

#include "rendezvous/rendezvous_error.h"

namespace ddprun::rendezvous {
namespace {

constexpr uint8_t kMagic[3] = {'D', 'R', 'E'};
constexpr size_t kFixed = 3 + 1 + 1 + 1 + 1 + 1;  // magic, version, kind, status, signal, flags
constexpr uint8_t kStoreCloses = 1;
constexpr uint8_t kForwardSignal = 2;
constexpr uint8_t kKnownFlags = kStoreCloses | kForwardSignal;

void put_text(Bytes& out, const std::string& text, size_t limit) {
  const size_t n = std::min(text.size(), limit);
  out.push_back(static_cast<uint8_t>(n >> 8));
  out.push_back(static_cast<uint8_t>(n & 0xff));
  out.insert(out.end(), text.begin(), text.begin() + static_cast<std::ptrdiff_t>(n));
}

// Reads a u16-prefixed text at `at`, moving `at` past it.
std::string take_text(const Bytes& in, size_t& at, size_t limit, const char* what) {
  if (in.size() - at < 2)
    throw RecordError(std::string("round end record: truncated before the ") + what + "'s length");
  const size_t n = (static_cast<size_t>(in[at]) << 8) | in[at + 1];
  at += 2;
  if (n > limit)
    throw RecordError(std::string("round end record: ") + what + " of " + std::to_string(n) +
                      " bytes, the limit is " + std::to_string(limit));
  if (in.size() - at < n)
    throw RecordError(std::string("round end record: truncated inside the ") + what + " (" +
                      std::to_string(in.size() - at) + " of " + std::to_string(n) + " bytes)");
  std::string text(in.begin() + static_cast<std::ptrdiff_t>(at),
                   in.begin() + static_cast<std::ptrdiff_t>(at + n));
  at += n;
  return text;
}

void put_u32(Bytes& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

uint32_t take_u32(const Bytes& in, size_t& at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | in[at + i];
  at += 4;
  return v;
}

uint16_t take_u16(const Bytes& in, size_t& at) {
  const uint16_t v = static_cast<uint16_t>((in[at] << 8) | in[at + 1]);
  at += 2;
  return v;
}

constexpr uint8_t kFailureMagic[3] = {'D', 'R', 'F'};
// magic, version, cause, generation, rank count
constexpr size_t kFailureFixed = 3 + 1 + 1 + 4 + 2;

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

// The header both records share (size, magic, version); `what` names the
// record in the RecordError.
void check_header(const Bytes& in, const char* what, const uint8_t (&magic)[3], uint8_t version,
                  size_t fixed) {
  const std::string name(what);
  if (in.size() < fixed)
    throw RecordError(name + ": " + std::to_string(in.size()) + " bytes, shorter than its " +
                      std::to_string(fixed) + "-byte header");
  if (in[0] != magic[0] || in[1] != magic[1] || in[2] != magic[2])
    throw RecordError(name + ": no " + std::string(magic, magic + 3) +
                      " magic (written by something other than ddprun)");
  if (in[3] != version)
    throw RecordError(name + ": version " + std::to_string(in[3]) + ", this ddprun reads " +
                      std::to_string(version) + " (every node must run the same ddprun)");
}

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
  Bytes out(kMagic, kMagic + 3);
  out.push_back(kRoundEndVersion);
  out.push_back(end.kind);
  out.push_back(static_cast<uint8_t>(end.exit_status));
  out.push_back(static_cast<uint8_t>(end.signal));
  out.push_back(static_cast<uint8_t>((end.store_closes ? kStoreCloses : 0) |
                                     (end.forward_signal ? kForwardSignal : 0)));
  put_text(out, end.node, kMaxEndNode);
  put_text(out, end.reason, kMaxEndReason);
  return out;
}

RoundEnd decode_round_end(const Bytes& in) {
  check_header(in, "round end record", kMagic, kRoundEndVersion, kFixed);
  if (!known_kind(in[4]))
    throw RecordError("round end record: unknown kind " + std::to_string(in[4]));
  if (in[7] & ~kKnownFlags)
    throw RecordError("round end record: unknown flags " + std::to_string(in[7]));
  RoundEnd end;
  end.kind = static_cast<RoundEnd::Kind>(in[4]);
  end.exit_status = in[5];
  end.signal = in[6];
  end.store_closes = in[7] & kStoreCloses;
  end.forward_signal = in[7] & kForwardSignal;
  size_t at = kFixed;
  end.node = take_text(in, at, kMaxEndNode, "node id");
  end.reason = take_text(in, at, kMaxEndReason, "reason");
  if (at != in.size())
    throw RecordError("round end record: " + std::to_string(in.size() - at) +
                      " bytes after its end");
  return end;
}

}  // namespace ddprun::rendezvous

namespace ddprun::rendezvous {

const char* cause_name(RankFailure::Cause cause) {
  return cause == RankFailure::kHang ? "hang" : "exit";
}

Bytes encode_rank_failure(const RankFailure& f) {
  if (!known_cause(f.cause))
    throw RecordError("rank failure record: unknown cause " + std::to_string(int(f.cause)));
  check_failure(f.generation, f.ranks);
  Bytes out(kFailureMagic, kFailureMagic + 3);
  out.push_back(kRankFailureVersion);
  out.push_back(f.cause);
  put_u32(out, static_cast<uint32_t>(f.generation));
  out.push_back(static_cast<uint8_t>(f.ranks.size() >> 8));
  out.push_back(static_cast<uint8_t>(f.ranks.size() & 0xff));
  for (int r : f.ranks) put_u32(out, static_cast<uint32_t>(r));
  put_text(out, f.node, kMaxEndNode);
  return out;
}

RankFailure decode_rank_failure(const Bytes& in) {
  check_header(in, "rank failure record", kFailureMagic, kRankFailureVersion, kFailureFixed);
  if (!known_cause(in[4]))
    throw RecordError("rank failure record: unknown cause " + std::to_string(in[4]));
  RankFailure f;
  f.cause = static_cast<RankFailure::Cause>(in[4]);
  size_t at = 5;
  f.generation = take_u32(in, at);
  const size_t count = take_u16(in, at);
  // Checked before the ranks are read: a count past the bytes present.
  if (in.size() - at < count * 4)
    throw RecordError("rank failure record: truncated inside the ranks (" +
                      std::to_string(in.size() - at) + " bytes for " + std::to_string(count) +
                      " ranks)");
  for (size_t i = 0; i < count; ++i) f.ranks.push_back(static_cast<int>(std::min<uint32_t>(
                                         take_u32(in, at), static_cast<uint32_t>(kMaxFailedRank))));
  check_failure(f.generation, f.ranks);
  f.node = take_text(in, at, kMaxEndNode, "node id");
  if (at != in.size())
    throw RecordError("rank failure record: " + std::to_string(in.size() - at) +
                      " bytes after its end");
  return f;
}

Bytes encode_formed(const Formed& f) {
  return to_bytes(std::to_string(f.size) + "\t" + std::to_string(f.closer));
}

Formed decode_formed(const Bytes& b, const std::string& key) {
  const std::string text = to_string(b);
  const size_t tab = text.find('\t');
  Formed f;
  try {
    size_t a = 0, c = 0;
    if (tab == std::string::npos) throw std::invalid_argument("no tab");
    f.size = std::stoll(text.substr(0, tab), &a);
    f.closer = std::stoll(text.substr(tab + 1), &c);
    if (a != tab || c != text.size() - tab - 1 || f.size < 0) throw std::invalid_argument("");
  } catch (const std::exception&) {
    throw RendezvousError("rendezvous: " + key + " holds '" + text.substr(0, 64) +
                          "', not '<size>\\t<closer>' (every node must run the same ddprun)");
  }
  return f;
}

}  // namespace ddprun::rendezvous
