// The RoundEnd codec (job_protocol.h has the byte layout). Depends on
// nothing but the standard library, so the fuzzer builds it alone.
#include "rendezvous/job_protocol.h"

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
  if (in.size() < kFixed)
    throw RecordError("round end record: " + std::to_string(in.size()) + " bytes, shorter than its " +
                      std::to_string(kFixed) + "-byte header");
  if (in[0] != kMagic[0] || in[1] != kMagic[1] || in[2] != kMagic[2])
    throw RecordError("round end record: no DRE magic (written by something other than ddprun)");
  if (in[3] != kRoundEndVersion)
    throw RecordError("round end record: version " + std::to_string(in[3]) + ", this ddprun reads " +
                      std::to_string(kRoundEndVersion) + " (every node must run the same ddprun)");
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
