// The multi-node job protocol: what the agents of one job write to the
// store and read back (the typed records of a round's end, its formation
// and a rank failure, the steps of a round's end, the exit barrier, the
// host's linger; KeepAlive::farewell in rendezvous.h is the farewell). The
// agent (agent/elastic_rendezvous.cc) and the rendezvous (rendezvous.cc,
// keep_alive.cc) use these. The keys are job_keys.h's, the records'
// codec record.h's: nothing else spells a key or lays out a record's bytes.
//
// The records, in record.h's layout (magic, version u8, then the fields;
// integers big-endian, texts u16-length-prefixed):
//   RoundEnd    "DRE" 1 | kind u8 | exit_status u8 | signal u8 |
//               flags u8 (bit 0: store_closes, bit 1: forward_signal) |
//               node text (<= kMaxEndNode) | reason text (<= kMaxEndReason)
//   RankFailure "DRF" 1 | cause u8 (1 exit, 2 hang) | generation u32 |
//               rank_count u16 | rank u32 x rank_count | node text
//               (1..kMaxFailedRanks ranks, ascending, each below
//               kMaxFailedRank; generation at most kMaxGeneration)
//   Formed      "DRC" 1 | size i64 (>= 0) | closer i64
// A reader rejects anything else (nothing may follow) with RecordError.
//
// Thread safety: the functions are reentrant; each takes the Store it uses
// (Stores are thread-compatible: one per thread).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/recovery_wire.h"
#include "rendezvous/job_keys.h"
#include "rendezvous/record.h"
#include "rendezvous/store.h"

namespace ddprun::rendezvous {

// Why a running round ended: written once per round (the first writer
// wins) and read by every member, so each reports the same root cause and
// exits with the same status.
struct RoundEnd {
  enum Kind : uint8_t {
    kFailed = 1,     // a node's workers failed (or its agent gave up)
    kScaleUp = 2,    // a late node waits to join: re-form, no restart spent
    kPeerDead = 3,   // a member's connection closed or its heartbeats stopped
    kStoreLost = 4,  // local only: this node lost the store (never written)
    kSignalled = 5,  // a member's agent was stopped by a signal
  };
  Kind kind = kFailed;
  // ddprun's exit status for this end, where it ends the job (1..255).
  int exit_status = 1;
  // kSignalled: the signal that stopped the agent (0 otherwise).
  int signal = 0;
  // The node the end concerns (its id), "" when none (kStoreLost).
  std::string node;
  // For people: "node X at A: worker rank 3 ended with exit code 7".
  std::string reason;
  // The writer hosts the store and is leaving with it: there is no next
  // round to join, the job ends with exit_status.
  bool store_closes = false;
  // kSignalled: the writer's workers got the signal too (its agent was
  // stopped while they ran); peers give theirs the same signal, with the
  // grace period, so every rank checkpoints the way the signal asks.
  bool forward_signal = false;
  // kStoreLost only (local, never written): the store's host refused a new
  // connection (StoreGoneError), so the store is gone rather than silent,
  // and the round's successor takes it over (docs/multinode.md).
  bool store_gone = false;

  // A restart is spent for a failure or a death, not for a scale-up.
  bool spends_restart() const { return kind == kFailed || kind == kPeerDead || kind == kSignalled; }
};

// "failed", "scale-up", "peer-dead", "store-lost", "signalled".
const char* kind_name(RoundEnd::Kind kind);

constexpr uint8_t kRoundEndVersion = 1;
constexpr size_t kMaxEndNode = 255;
constexpr size_t kMaxEndReason = 2048;

// Longer node ids and reasons are cut to their limits; an exit status or a
// signal out of range throws RecordError (a bug in the caller).
Bytes encode_round_end(const RoundEnd& end);
// Throws RecordError naming the defect (short, too long, wrong magic or
// version, unknown kind, trailing bytes).
RoundEnd decode_round_end(const Bytes& bytes);

// Added to a round's join counter by its closer once the round is formed:
// a node that joins it later gets a slot above this and knows at once.
constexpr int64_t kFormedMark = int64_t{1} << 40;

// r<N>/closed: the round's size and whose assignment won.
struct Formed {
  int64_t size = 0;
  int64_t closer = 0;
};
Bytes encode_formed(const Formed& f);
// Throws RendezvousError naming `key` and the value that is no record.
Formed decode_formed(const Bytes& b, const std::string& key);

// The exit barrier's per-node outcome values.
inline Bytes outcome_ok() { return to_bytes("ok"); }
inline Bytes outcome_failed() { return to_bytes("failed"); }

// --restart-scope=rank on several nodes: the node whose rank(s) failed
// opens generation G with this record in the round's namespace; every
// other node's agent reads it and tells its own survivors (event=failed on
// the recovery channel, docs/RECOVERY.md), so the whole job re-forms under
// G without a restart.
struct RankFailure {
  enum Cause : uint8_t { kExit = 1, kHang = 2 };
  int64_t generation = 0;
  std::vector<int> ranks;  // global ranks, ascending
  Cause cause = kExit;
  std::string node;  // the node whose ranks failed (its id)
};

constexpr uint8_t kRankFailureVersion = 1;
constexpr size_t kMaxFailedRanks = 4096;
// The recovery channel's limits, so a record always fits its packets.
constexpr int64_t kMaxFailedRank = base::recovery_wire::kMaxRank;
constexpr int64_t kMaxGeneration = base::recovery_wire::kMaxGeneration;

// "exit" or "hang" (the recovery channel's cause= words).
const char* cause_name(RankFailure::Cause cause);
// Throws RecordError for a record out of its limits (a bug in the caller);
// the node id is cut to kMaxEndNode.
Bytes encode_rank_failure(const RankFailure& failure);
// Throws RecordError naming the defect.
RankFailure decode_rank_failure(const Bytes& bytes);

// ---- Steps, each on the caller's Store connection ----

// Opens generation failure.generation of round r; the first writer wins.
// False when another record holds it already: a second failure before
// recovery, which the caller ends as a group restart (publish_end).
bool publish_rank_failure(Store& store, const JobKeys& keys, int64_t r, const RankFailure& failure);
// Generation g's failure, or nullopt while none (never blocks).
std::optional<RankFailure> read_rank_failure(Store& store, const JobKeys& keys, int64_t r,
                                             int64_t g);
// Blocks up to `timeout` (TimeoutError) for generation g's failure.
RankFailure await_rank_failure(Store& store, const JobKeys& keys, int64_t r, int64_t g,
                               Duration timeout);
// The other agents' watch (run it off the event loop, on a Store of its
// own, e.g. in a base::OffLoopTask): blocks until generation g's failure is
// written, waking as the store delivers it (a waiting get, not a poll), and
// returns it; every `slice` it asks `stop` and returns nullopt once true.
// StoreError / RecordError propagate (the store is lost, an unreadable
// record: the caller falls back to a group restart).
std::optional<RankFailure> watch_rank_failure(Store& store, const JobKeys& keys, int64_t r,
                                              int64_t g, const std::function<bool()>& stop,
                                              Duration slice);
// Records that every local rank of this node joined generation g; call it
// once per node and generation. A counter rather than one key a node, so
// that no node needs the member list (a round's nodes read only their own
// assignment): the node that brings it to `nodes` (the round's size)
// writes generation_formed.
void publish_generation_joined(Store& store, const JobKeys& keys, int64_t r, int64_t g,
                               int nodes);
// One slice: true once every node joined generation g (recovery is then
// complete), false when not within `slice`; a waiting check, not a poll.
bool generation_formed_within(Store& store, const JobKeys& keys, int64_t r, int64_t g,
                              Duration slice);


// Ends round `r` with `end` when nobody has yet; the first writer wins and
// counts the job-wide restart (when end.spends_restart()). True when this
// call ended it.
bool publish_end(Store& store, const JobKeys& keys, int64_t r, const RoundEnd& end);
// Round r's end, or nullopt while it runs (never blocks). RecordError for a
// record this ddprun cannot read.
std::optional<RoundEnd> read_end(Store& store, const JobKeys& keys, int64_t r);
// Blocks up to `timeout` for round r's end (TimeoutError), then records
// that `node` read it (a lingering host waits for that).
RoundEnd await_end(Store& store, const JobKeys& keys, int64_t r, const std::string& node,
                   Duration timeout);
// The host's linger: waits, up to `limit`, until every one of `peers` has
// read round r's end or was marked dead (its connection closed: it is gone
// and reads nothing more). Returns the peers that did neither in time.
std::vector<std::string> linger(Store& store, const JobKeys& keys, int64_t r,
                                const std::vector<std::string>& peers, Duration limit);
// One slice of the exit barrier: records nothing, waits up to `slice` for
// every node's outcome in round r; nullopt when some are still missing,
// else whether all are ok.
std::optional<bool> outcomes_within(Store& store, const JobKeys& keys, int64_t r,
                                    const std::vector<std::string>& nodes, Duration slice);

}  // namespace ddprun::rendezvous
