// What one node's watchdog tells the others through the job's store (the
// exchange is PeerGuards', the keys rendezvous::GuardKeys'): the sections
// and setups its ranks are in, with the time each has left, and, with
// --restart-scope=rank, the stall it sees and the ranks it blames.
//
// On the wire, in rendezvous/record.h's layout (big-endian):
//   "DWG" | version u8 (1) | seq u64 |
//   guard_count u16 | (rank u32 | section text | remaining_ms i64) x count |
//   has_stall u8 (0 or 1) | [rank u32 | step i64 | silent_ms i64] |
//   blamed_count u16 | rank u32 x count
// Times are durations by the publisher's clock, so no two nodes' clocks
// are compared. Ranks are below heartbeat_wire::kMaxRank, sections at most
// kMaxSectionBytes ("setup" for a setup), at most kMaxGuards guards and
// blamed ranks. The reader refuses anything else (rendezvous::RecordError).
//
// Thread safety: the functions are reentrant.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::watchdog {

// A guard as it travels: rank, section ("setup" for a setup), time left.
struct SharedGuard {
  int rank = -1;
  std::string section;
  std::chrono::milliseconds remaining{0};
  bool operator==(const SharedGuard& o) const {
    return rank == o.rank && section == o.section && remaining == o.remaining;
  }
};

// A node's stalled ranks, as it tells the others: the rank it would blame,
// that rank's last step, and how long it has been silent (by its clock).
struct PeerStall {
  int rank = -1;
  int64_t step = -1;
  std::chrono::milliseconds silent{0};
  bool operator==(const PeerStall& o) const {
    return rank == o.rank && step == o.step && silent == o.silent;
  }
};

// What one node publishes.
struct NodeRecord {
  std::vector<SharedGuard> guards;
  std::optional<PeerStall> stall;
  std::vector<int> blamed;  // global ranks this node acts on as hung
  bool operator==(const NodeRecord& o) const {
    return guards == o.guards && stall == o.stall && blamed == o.blamed;
  }
};

// Another node's record as read.
struct NodeGuards {
  int node = -1;
  uint64_t seq = 0;  // the publisher's count: an unchanged one is not read again
  NodeRecord record;
};

inline constexpr size_t kMaxGuards = 4096;

// A section is cut to kMaxSectionBytes (the heartbeat server lets no longer
// one in); throws rendezvous::RecordError for a rank out of its limits or
// too many guards (a bug in the caller).
std::vector<uint8_t> encode_guards(uint64_t seq, const NodeRecord& record);
// Throws rendezvous::RecordError naming the node and the defect.
NodeGuards decode_guards(int node, const std::vector<uint8_t>& bytes);

}  // namespace ddprun::watchdog
