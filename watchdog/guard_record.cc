#include "watchdog/guard_record.h"

#include "rendezvous/record.h"
#include "watchdog/heartbeat_wire.h"

namespace ddprun::watchdog {

namespace {

using rendezvous::RecordError;
using rendezvous::RecordReader;
using rendezvous::RecordWriter;

constexpr rendezvous::RecordKind kGuardRecord{"guard record", {'D', 'W', 'G'}, 1};
constexpr size_t kHeader = 3 + 1 + 8 + 2;     // magic, version, seq, guard count
constexpr size_t kMinGuardBytes = 4 + 2 + 8;  // rank, section length, remaining

uint32_t checked_rank(int rank) {
  if (rank < 0 || rank >= heartbeat_wire::kMaxRank)
    throw RecordError("guard record: rank " + std::to_string(rank) + " is outside 0.." +
                      std::to_string(heartbeat_wire::kMaxRank - 1));
  return static_cast<uint32_t>(rank);
}

int read_rank(RecordReader& r, const char* field) {
  const uint32_t rank = r.u32(field);
  if (rank >= heartbeat_wire::kMaxRank)
    r.fail(std::string(field) + " " + std::to_string(rank) + " is outside 0.." +
           std::to_string(heartbeat_wire::kMaxRank - 1));
  return static_cast<int>(rank);
}

}  // namespace

std::vector<uint8_t> encode_guards(uint64_t seq, const NodeRecord& record) {
  RecordWriter w(kGuardRecord);
  w.u64(seq).count(record.guards.size(), kMaxGuards, "guards");
  for (const auto& g : record.guards) {
    w.u32(checked_rank(g.rank))
        .text(g.section, heartbeat_wire::kMaxSectionBytes)
        .i64(g.remaining.count());
  }
  w.u8(record.stall ? 1 : 0);
  if (record.stall)
    w.u32(checked_rank(record.stall->rank))
        .i64(record.stall->step)
        .i64(record.stall->silent.count());
  w.count(record.blamed.size(), kMaxGuards, "blamed ranks");
  for (int rank : record.blamed) w.u32(checked_rank(rank));
  return w.take();
}

NodeGuards decode_guards(int node, const std::vector<uint8_t>& bytes) {
  NodeGuards out;
  out.node = node;
  try {
    RecordReader r(bytes, kGuardRecord, kHeader);
    out.seq = r.u64("seq");
    const size_t guards = r.count(kMaxGuards, kMinGuardBytes, "guards");
    for (size_t i = 0; i < guards; ++i) {
      SharedGuard g;
      g.rank = read_rank(r, "guard rank");
      g.section = r.text(heartbeat_wire::kMaxSectionBytes, "section");
      if (g.section.empty()) r.fail("an empty section");
      g.remaining = std::chrono::milliseconds(r.i64("remaining time"));
      out.record.guards.push_back(std::move(g));
    }
    const uint8_t has_stall = r.u8("stall flag");
    if (has_stall > 1) r.fail("stall flag " + std::to_string(has_stall));
    if (has_stall) {
      PeerStall s;
      s.rank = read_rank(r, "stall rank");
      s.step = r.i64("stall step");
      s.silent = std::chrono::milliseconds(r.i64("silent time"));
      out.record.stall = s;
    }
    const size_t blamed = r.count(kMaxGuards, 4, "blamed ranks");
    for (size_t i = 0; i < blamed; ++i) out.record.blamed.push_back(read_rank(r, "blamed rank"));
    r.finish();
  } catch (const RecordError& e) {
    throw RecordError("node " + std::to_string(node) + "'s " + e.what());
  }
  return out;
}

}  // namespace ddprun::watchdog
