// NodeBoard: `ddprun status` across nodes through the job's store.
//
// Each agent of a multi-node round publishes its status reply (the JSON of
// control_wire.h, plus "node" and "published_unix") under
//   rdzv/<run_id>/introspect/round_<n>/node/<group rank>
// in the agents' store, once per sample (latest wins), and reads the
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
// request for every other node (a counter per node, then the request under
// its number); each board looks for new requests of its node once a second
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
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/service_thread.h"

#include "rendezvous/canceller.h"
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

// The store key of `node`'s entry in the round of `store_prefix`.
std::string board_key(const std::string& store_prefix, int node);

class NodeBoard {
 public:
  // The other nodes' entries (never this one's), by group rank, and why
  // some could not be read ("" when all were).
  using Fetched = std::function<void(std::vector<nlohmann::json> peers, std::string error)>;

  // A stacks request from another node: {"id", "rank"}.
  using Requested = std::function<void(nlohmann::json request)>;
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
  void run();
  std::string key(const std::string& name) const;

  BoardPlace place_;
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
