// Elastic multi-node rendezvous on top of the store (torchrun's c10d
// dynamic rendezvous, with stable group ranks and a job-wide restart count).
//
// Nodes join numbered rounds. A round closes at max_nodes at once, or at
// min_nodes plus last_call_timeout. Group ranks are deterministic: a node
// keeps its previous group rank when it still fits, and the other nodes
// fill the free ranks in first-join order (the round and slot of a node's
// first join). One node closes a round: it writes every member's own
// assignment (rank, sizes, master, the peers it watches), and each node
// reads only its own, so the bytes per node stay flat with the job's size.
// While a round runs, KeepAlive heartbeats this node and
// watches its next four peers in group-rank order (a ring: every node has
// four watchers, and the work per node stays flat with the job); the round
// ends for everyone when any node signals a failure, a member's KeepAlive
// connection closes (the store ends the round itself: a killed agent is
// noticed at once), a watched peer misses
// keep_alive_max_attempt heartbeats (silent deaths: power, partition), or a
// late node waits to be taken in (scale-up, which spends no restart).
// The next round closes as soon as every node expected back has joined
// (the members of the last round not found dead, and for a late node the
// members of the round it asked to re-form), without the last call; and
// the last call does not close it before they are back, for up to
// max(last_call_timeout, close_timeout): a member slow to stop its workers
// is not left out, so the members that stay keep their group ranks.
//
// Store keys live under "rdzv/<run_id>/" (JobKeys, job_protocol.h).
// Rendezvous is thread-compatible; KeepAlive runs its own thread on its own
// store connection.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/job_protocol.h"
#include "rendezvous/rendezvous_error.h"
#include "rendezvous/store.h"

namespace ddprun::rendezvous {

struct RendezvousOptions {
  // --rdzv-id: separates jobs sharing one store.
  std::string run_id = "none";
  // --nnodes MIN:MAX.
  int min_nodes = 1;
  int max_nodes = 1;
  // Workers on this node.
  int local_world_size = 1;
  // Unique per agent process; empty picks hostname:pid:random.
  std::string node_id;
  // Address peers reach this node at: MASTER_ADDR when it is group rank 0
  // (--local-addr). Empty: the address its store connection leaves from
  // (right on multi-NIC hosts), else the host name.
  std::string local_addr;
  // MASTER_PORT this node offers when it is group rank 0.
  int master_port = 0;
  // --rdzv-conf keys, torchrun's names and defaults.
  Duration join_timeout{600000};
  Duration last_call_timeout{30000};
  Duration close_timeout{30000};  // records of joined nodes must appear within it
  Duration keep_alive_interval{5000};
  int keep_alive_max_attempt = 3;
  bool is_host = false;  // this agent hosts the store (read by the agent)
  // This agent serves the store: the Rendezvous announces it (store_host),
  // so every round names a successor for it.
  bool hosts_store = false;
};

// The longest duration a --rdzv-conf key may give (about 11.6 days): past
// it deadlines computed in milliseconds would overflow or be meaningless.
constexpr double kMaxConfSeconds = 1e6;

// Applies torchrun-compatible --rdzv-conf keys (join_timeout and
// keep_alive_interval in seconds > 0, last_call_timeout and close_timeout
// in seconds >= 0, all finite and <= kMaxConfSeconds;
// keep_alive_max_attempt 1..1000000; is_host; token and read_timeout are
// accepted and left to the caller; torch 2.x's store_type=tcp,
// heartbeat_timeout and cas_backoff_max_seconds are checked and have no
// effect, docs/TORCHRUN_2.md). Throws RendezvousError naming a bad key
// and the allowed range.
void apply_rdzv_conf(const std::map<std::string, std::string>& conf, RendezvousOptions& options);

// A node as recorded in a round.
struct NodeInfo {
  std::string node_id;
  std::string addr;
  int master_port = 0;
  int local_world_size = 1;
  int64_t seq = 0;  // first-join order in the job
};

// Peers each node's KeepAlive watches: its successors in group-rank order,
// in a ring. Every node is watched by this many, and one watcher ending the
// round is enough; watching all N-1 peers made each beat read N-1
// counters, O(N^2) bytes a beat across the job.
constexpr size_t kWatchedPeers = 4;

// A member of a round and its group rank.
struct Peer {
  int group_rank = 0;
  NodeInfo node;
};

// What one node reads of a formed round: its own slot and the few peers it
// watches, a record of constant size whatever the round's size (all N
// records for every node was O(N^2) bytes a round). The closer writes one
// per member (job_protocol.h: r<N>/a<closer>/<node_id>).
struct Assignment {
  int group_rank = 0;
  int group_world_size = 1;
  int rank_base = 0;   // global rank of the node's local rank 0
  int world_size = 1;  // sum of local world sizes
  std::string master_addr;
  int master_port = 0;
  std::vector<Peer> watched;  // the next min(kWatchedPeers, N-1) in group-rank order
  // The member that takes the store over if its host's agent dies: the
  // lowest group rank that does not host it (none when no member hosts
  // the store, e.g. ddprun-store or etcd).
  std::optional<NodeInfo> successor;
};

// This node's view of a formed round: its assignment (watched: the peers
// its KeepAlive watches), and where the round is.
struct RoundResult : Assignment {
  int64_t round = 0;
  std::string store_prefix;  // for the round's workers: "<run_id>/round_<n>/"
  // The seq of the node whose assignment won the round's close: where the
  // full member list is (read_members; not read to form a round).
  int64_t closer = 0;
};

class KeepAlive;

class Rendezvous {
 public:
  // Makes a fresh store connection; called once here and once per KeepAlive
  // (before that KeepAlive's join, see keep_alive_store_).
  using StoreFactory = std::function<std::unique_ptr<Store>()>;

  // `keep_alive_factory` makes KeepAlive's connections (default: `factory`).
  // It must not share a canceller with the others: a node that stops on
  // purpose disarms its death notice on that connection before it leaves.
  Rendezvous(StoreFactory factory, RendezvousOptions options,
             StoreFactory keep_alive_factory = nullptr);
  ~Rendezvous();

  // Replaces this node's store connection with a fresh one (the factory's
  // deadlines): after the store was lost and reached again, the old one
  // may be dead. Throws RendezvousError.
  void reconnect();
  // Joins the next round and blocks until it is formed (join_timeout).
  // Throws RendezvousError naming how many nodes came and from where, or
  // the store failure. Connects the round's KeepAlive first (watch()).
  RoundResult next_round();
  // Ends the current round for every node with `end` (this node failed or
  // was stopped); counts one job-wide restart (once per round, whoever
  // signals first).
  void signal_failure(const RoundEnd& end);
  // Job-wide restarts so far.
  int64_t restart_count();
  // Starts heartbeating the current round and watching it. `on_end` runs on
  // the KeepAlive thread, once, when the round ends for any reason.
  std::unique_ptr<KeepAlive> watch(std::function<void(const RoundEnd&)> on_end);

  const RendezvousOptions& options() const { return options_; }
  const std::string& node_id() const { return options_.node_id; }
  const JobKeys& keys() const { return keys_; }

 private:
  friend class KeepAlive;
  std::string join_error(int64_t round, const std::string& what);
  // Decides the assignment of a round from its first `n` slots and tries to
  // publish it; whoever publishes first wins.
  void close_round(int64_t round, int64_t n);
  // True when this node holds round's close (it claimed it now or before).
  // The last call's wait for round `round`'s close, until `until`; says so
  // on the console when it lasts (rendezvous.cc). Throws TimeoutError.
  Bytes wait_last_call(int64_t round, const std::string& closed,
                       std::chrono::steady_clock::time_point until);
  bool claims_close(int64_t round);
  // close_round by the one node that claims it first; the others wait.
  void close_once(int64_t round, int64_t n, Duration left_to_join);
  RoundResult result_from(int64_t round, int64_t closer, Assignment a);
  // Past round `round`, which is running without this node or is the one
  // it was a member of: the round current names now (a scale-up request
  // published first when this node is no member and the group has room).
  int64_t move_past(int64_t round, const NodeInfo& me, bool member);
  // Having joined `round` in `slot`: closes it or waits for it to close,
  // by `deadline`; r<N>/closed's value. RendezvousError past the deadline.
  Bytes await_close(int64_t round, int64_t slot, std::chrono::steady_clock::time_point deadline);
  // The previous round's members, for the stable rank rule (the closer's
  // read: O(N) bytes, one node a round).
  std::vector<NodeInfo> previous_members();
  // read_members on this node's connection, the last list kept.
  const std::vector<NodeInfo>& members_of(int64_t round, int64_t closer);
  // Whether this node may expect members back in the round it joins (it
  // was a member of the last round and not marked dead there, or it asked
  // a round to re-form for it).
  bool may_expect();
  // The nodes this node expects back in the round it joins (itself left
  // out): the members of its last round not marked dead, and those of a
  // round it asked to re-form for it (scale-up). Read by the round's close
  // claimer only: the member lists are O(N) bytes.
  std::set<std::string> expected_members();
  // Members of the last round seen dead (two store reads).
  std::set<std::string> dead_members();
  // Waits (until `until`) for every expected node to join round `r`;
  // true when all have, or false (closed by someone, or the time passed).
  bool wait_for_expected(int64_t r, const std::set<std::string>& expected,
                         std::chrono::steady_clock::time_point until);

  StoreFactory factory_;
  StoreFactory keep_alive_factory_;
  RendezvousOptions options_;
  JobKeys keys_;
  std::unique_ptr<Store> store_;
  // The next KeepAlive's connection, made when its round's join begins, not
  // when the round forms: every node of a round gets it at the same moment,
  // and N connections and handshakes at once (3 a node with the agent's
  // hooks) went past the store's per-address and per-subnet limits for
  // connections not yet authenticated, whose refusals cost each node
  // retries with a growing back-off (256 agents on one host).
  // Joins arrive as the nodes start, spread out.
  std::unique_ptr<Store> keep_alive_store_;
  int64_t seq_ = -1;  // first-join order: (round << 32) | slot of the first join
  std::optional<RoundResult> current_;
  // The running round this node asked to re-form (a scale-up), its round
  // and closer, until it has joined the next: its members come back for us.
  std::optional<std::pair<int64_t, int64_t>> awaited_;
  struct MemberList {
    int64_t round = 0;
    int64_t closer = 0;
    std::vector<NodeInfo> nodes;
  };
  std::optional<MemberList> members_;  // the last list members_of read
};

// Heartbeats one round and watches it on a thread with its own store
// connection. Destruction stops the thread (within about a second).
class KeepAlive {
 public:
  KeepAlive(std::unique_ptr<Store> store, const Rendezvous& rdzv, RoundResult round,
            std::function<void(const RoundEnd&)> on_end);
  ~KeepAlive();
  KeepAlive(const KeepAlive&) = delete;
  KeepAlive& operator=(const KeepAlive&) = delete;

  // A stopping node's farewell on this KeepAlive's connection, the one that
  // outlives a cancelled node's others: stops the watching, publishes `end`
  // when given (unless the round already ended) and, on the store's host,
  // lingers up
  // to `linger_limit` until the other members read it or are gone, so each
  // reports this end rather than a vanished store. False when `end` was not
  // the round's (it had ended). Store failures are logged, not thrown.
  bool farewell(const std::optional<RoundEnd>& end, bool host, Duration linger_limit);

 private:
  void run();

  std::unique_ptr<Store> store_;
  RendezvousOptions options_;
  JobKeys keys_;
  std::string prefix_;  // "rdzv/<run_id>/r<round>/"
  RoundResult round_;
  std::function<void(const RoundEnd&)> on_end_;
  std::atomic<bool> stop_{false};
  bool on_close_armed_ = false;  // the store ends the round if our connection closes
  std::thread thread_;
};

// In a round's end reason when the store saw a member's connection close.
inline constexpr const char* kConnectionClosed = "closed its store connection";

// A round's records, in rendezvous/record.h's layout (big-endian; a node
// is node id text | address text | port u16 | local world size u32 |
// seq i64, its id and address never cut: longer than 4096 bytes, encoding
// throws RecordError):
//   node record        "DRN" 1 | node
//   members record     "DRM" 1 | count u32 | node x count
//   assignment record  "DRA" 1 | group_rank u32 | group_world_size u32 |
//                      rank_base u32 | world_size u32 | master_addr text |
//                      master_port u16 | watched u16 (<= kWatchedPeers) |
//                      (group_rank u32 | node) x watched |
//                      has_successor u8 (0 or 1) | [node]
// A decoder returns nullopt (decode_nodes: none) for anything else.
Bytes encode_node(const NodeInfo& node);
std::optional<NodeInfo> decode_node(const Bytes& bytes);
Bytes encode_nodes(const std::vector<NodeInfo>& nodes);
std::vector<NodeInfo> decode_nodes(const Bytes& bytes);
Bytes encode_assignment(const Assignment& a);
std::optional<Assignment> decode_assignment(const Bytes& bytes);
// Every member's assignment, in group-rank order, from the members in
// group-rank order (rank bases, the master, the watched ring, and the
// successor of `store_host`, the id of the member hosting the store: ""
// or an id no member has names none).
std::vector<Assignment> assignments(const std::vector<NodeInfo>& members,
                                    const std::string& store_host = "");

// The members of a formed round in group-rank order: O(N) bytes, for the
// few that need them all (the exit barrier, the host's linger, the next
// closer), on the caller's store connection. Throws StoreError or
// TimeoutError (the record is gone), RendezvousError (unreadable).
std::vector<NodeInfo> read_members(Store& store, const JobKeys& keys, int64_t round,
                                   int64_t closer);
inline std::vector<NodeInfo> read_members(Store& store, const JobKeys& keys,
                                          const RoundResult& round) {
  return read_members(store, keys, round.round, round.closer);
}

// The stable rank rule, exposed for tests: nodes whose previous group rank
// is below nodes.size() keep it; the others fill the free ranks in seq order.
std::vector<NodeInfo> assign_ranks(std::vector<NodeInfo> nodes,
                                   const std::vector<NodeInfo>& previous);

}  // namespace ddprun::rendezvous
