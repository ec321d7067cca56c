// NodeBoard: `ddprun status` across nodes through the job's store.
//
// Each agent of a multi-node round publishes its status reply (the JSON of
// control_wire.h, plus "node" and "published_unix": the document `ddprun
// status --json` prints, relayed as it is) under
//   rdzv/<run_id>/introspect/round_<n>/node/<group rank>
// (rendezvous::BoardKeys has every key of the board) in the agents'
// store, once per sample (latest wins), and reads the
// other nodes' entries when a status request asks for them. Keys live in the
// round's prefix, so a new round starts with a clean board and rows of a
// round that ended are never shown; and inside the run's own folder, which
// the agents delete from etcd when the job ends (a TCP store ends with it).
//
// The store is reached only from the board's own thread, with its own
// connection through the agents' Store interface, so every backend works,
// etcd included (store calls block, the agent's loop never does): publish() and
// fetch() hand work to it and return at once; fetch's callback runs on the
// board's thread (the caller posts it back to its loop). Every store call
// has a deadline (kStoreDeadline); a node that has not published yet is
// left out, not waited for. The destructor cancels a blocked call (the
// store may be gone) and joins.
//
// Stacks across nodes go through the store too: ask_stacks() writes a
// request for every other node (a counter per node, then a StacksRequest
// record under its number); each board looks for new requests of its node once a second
// and hands them to `on_request` (the agent captures its ranks' stacks and
// gives the reply to answer()); the asker collects the nodes' replies until
// every node answered or kAskDeadline passed.
//
// Thread safety: publish, fetch, ask_stacks, answer and the destructor from
// one thread (the agent's loop); the callbacks on the board's thread.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/service_thread.h"

#include "rendezvous/canceller.h"
#include "rendezvous/job_keys.h"
#include "rendezvous/lazy_client.h"
#include "rendezvous/store.h"

namespace ddprun::introspect {

struct BoardPlace {
  // Opens a connection to the agents' store (ddprun's TCP store or etcd:
  // agent::RoundInfo::open_agents_store), called on the board's thread.
  using Opener = std::function<std::unique_ptr<rendezvous::Store>(
      rendezvous::Duration deadline, std::shared_ptr<rendezvous::Canceller> canceller)>;
  Opener open_store;
  std::string store_name;    // for errors: "host:port", "etcd at EP"
  std::string store_prefix;  // the round's board prefix, "rdzv/<run_id>/introspect/round_<n>/"
  int node = 0;              // this agent's group rank
  int nodes = 1;             // group world size of the round
};

// Another node asks for the stacks of its rank `rank` (-1: all its ranks),
// to be answered under `id`. On the wire, in rendezvous/record.h's layout:
//   "DSR" | version u8 (1) | rank i64 (-1..INT_MAX) | id text (<= 64 bytes)
struct StacksRequest {
  std::string id;
  int rank = -1;
};
rendezvous::Bytes encode_stacks_request(const StacksRequest& request);
// Throws rendezvous::RecordError naming the defect.
StacksRequest decode_stacks_request(const rendezvous::Bytes& bytes);

class NodeBoard {
 public:
  // The other nodes' entries (never this one's), by group rank, and why
  // some could not be read ("" when all were).
  using Fetched = std::function<void(std::vector<nlohmann::json> peers, std::string error)>;

  // A stacks request from another node.
  using Requested = std::function<void(StacksRequest request)>;
  // The other nodes' stacks replies, and one line per node that failed to
  // answer in time.
  using Asked = std::function<void(std::vector<nlohmann::json> replies,
                                   std::vector<std::string> errors)>;

  static constexpr std::chrono::seconds kStoreDeadline{3};
  // How long the other nodes have to answer a stacks request.
  static constexpr std::chrono::seconds kAskDeadline{45};

  NodeBoard(BoardPlace place, Requested on_request);
  ~NodeBoard();
  NodeBoard(const NodeBoard&) = delete;
  NodeBoard& operator=(const NodeBoard&) = delete;

  // Replaces the entry to publish; the thread sends the newest one.
  void publish(nlohmann::json status);
  // Reads every other node's entry; `done` is called once, on the board's
  // thread, within a few store deadlines.
  void fetch(Fetched done);
  // Asks every other node for the stacks of `rank` (-1: all its ranks).
  void ask_stacks(int rank, Asked done);
  // This node's reply to the request `id`.
  void answer(const std::string& id, nlohmann::json reply);

 private:
  struct Ask {
    int rank = -1;
    Asked done;
    std::string id;
    std::vector<int> left;  // nodes yet to answer
    std::chrono::steady_clock::time_point deadline;
    std::vector<nlohmann::json> replies;
  };
  using SteadyClock = std::chrono::steady_clock;
  // What run() keeps across its wakes.
  struct Loop {
    std::vector<Ask> asks;      // sent, waiting for replies
    int64_t seen_requests = 0;  // this node's requests handed on so far
    uint64_t asked = 0;
    SteadyClock::time_point next_poll;
  };
  // What one wake takes over from the loop's thread.
  struct Taken {
    std::optional<nlohmann::json> entry;
    std::vector<Fetched> waiting;
    std::vector<Ask> asks;
    std::vector<std::pair<std::string, nlohmann::json>> answers;
  };
  void run();
  // The steps of one wake, on the board's thread.
  void publish_entry(rendezvous::LazyStore& store, nlohmann::json entry);
  Ask send_ask(rendezvous::LazyStore& store, Ask ask, uint64_t number);
  void take_requests(rendezvous::LazyStore& store, int64_t& seen);
  void collect_replies(rendezvous::LazyStore& store, std::vector<Ask>& asks);
  void read_peers(rendezvous::LazyStore& store, std::vector<Fetched>& waiting);

  BoardPlace place_;
  rendezvous::BoardKeys keys_;
  std::shared_ptr<rendezvous::Canceller> canceller_;
  // Guarded by service_'s mutex (hand_over / wait_until's take):
  bool has_entry_ = false;
  nlohmann::json entry_;
  std::vector<Fetched> waiting_;
  std::vector<Ask> new_asks_;
  std::vector<std::pair<std::string, nlohmann::json>> answers_;
  Requested on_request_;
  base::ServiceThread service_;
};

}  // namespace ddprun::introspect
