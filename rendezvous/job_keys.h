// Every store key the agents of a job spell, in one place: the job's and
// its rounds' (JobKeys, read and written by job_protocol.h's steps), the
// status board's (BoardKeys, introspect/node_board.h) and the watchdog's
// guard exchange (GuardKeys, watchdog/peer_guards.h). What the values hold
// is job_protocol.h's, watchdog/guard_record.h's and the board's to say.
//
// Keys, all under "rdzv/<run_id>/" (JobKeys):
//   current            the round being formed (an integer)
//   store_host         the node id of the agent that hosts the store
//   last_closed        the newest formed round
//   restarts           job-wide restart count
//   gave_up, gave_up/<n>  nodes that gave up a join that never formed
//   introspect/round_<N>/  the agents' status board of round N (BoardKeys)
//   r<N>/joined        join counter of round N (its closer adds 2^40 once
//                      it is formed); r<N>/node/<slot> = a node record
//   r<N>/closed        the round is formed: a Formed record (its size and
//                      whose assignment won: the first to write it)
//   r<N>/a<S>/<node_id>  closer S's assignment of that node (Assignment in
//                      rendezvous.h: rank, sizes, master, watched peers),
//                      all written before S tries r<N>/closed
//   r<N>/m<S>          closer S's members in group-rank order (a members
//                      record): read by few (read_members)
//   r<N>/closer        the node that claimed closing the round
//   r<N>/end           why the round ended: an encoded RoundEnd
//   r<N>/end_seen/<node_id>  the node's keep-alive read r<N>/end
//   r<N>/hb/<node_id>  heartbeat counter
//   r<N>/dead/<node_id>  set when the member was seen dead (connection
//                      closed, or heartbeats missed)
//   r<N>/dead_closed   the node whose closed connection ended the round
//   r<N>/dead_seen     nodes seen missing heartbeats, one id a line
//   r<N>/outcome/<node_id>  "ok" or "failed": the exit barrier's records
//   r<N>/exited/<node_id>   the node read the finished job's outcome
//   r<N>/gen/<G>/failed     --restart-scope=rank across nodes: an encoded
//                      RankFailure, the ranks whose loss opens generation G
//                      (the first writer wins; a second is a second failure)
//   r<N>/gen/<G>/joined     how many nodes' ranks joined generation G (a
//                      counter: each node adds 1 once)
//   r<N>/gen/<G>/formed     every node joined G: written by the last to join
//
// The status board of round N, under its prefix (JobKeys::introspect(N)):
//   node/<group rank>           that agent's status reply (control_wire JSON)
//   stacks/count/<group rank>   the stacks requests that node was sent
//   stacks/req/<group rank>/<n> request n (a StacksRequest record)
//   stacks/reply/<id>/<group rank>  that node's reply to request <id> (control_wire JSON)
//
// The guard exchange of a round, in the round's workers' store, under
// "ddprun-watchdog/<round's store prefix>guards/" (beside, never among, the
// keys the workers' own TCPStore clients write):
//   <group rank>   that node's guard record (watchdog/guard_record.h)
//   changes        a counter every publisher bumps
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace ddprun::rendezvous {

// The store keys of one job (see the list above).
class JobKeys {
 public:
  explicit JobKeys(const std::string& run_id) : base_("rdzv/" + run_id + "/") {}
  // Every key of the job starts with this: "rdzv/<run_id>/".
  const std::string& job() const { return base_; }
  std::string job(const std::string& key) const { return base_ + key; }
  // "rdzv/<run_id>/r<round>/", and a key inside it.
  std::string round(int64_t round) const { return base_ + "r" + std::to_string(round) + "/"; }
  std::string round(int64_t r, const std::string& key) const { return round(r) + key; }
  std::string restarts() const { return job("restarts"); }
  std::string current() const { return job("current"); }
  std::string last_closed() const { return job("last_closed"); }
  // The node id of the agent hosting the store (the one the closer names a
  // successor for); rewritten by a successor that takes the store over.
  std::string store_host() const { return job("store_host"); }
  // The counter of nodes that gave up a join, and the n-th one's mark.
  std::string gave_up() const { return job("gave_up"); }
  std::string gave_up(int64_t n) const { return job("gave_up/" + std::to_string(n)); }
  std::string joined(int64_t r) const { return round(r, "joined"); }
  // The record of the node that took join slot `slot` (1-based).
  std::string node_slot(int64_t r, int64_t slot) const {
    return round(r, "node/" + std::to_string(slot));
  }
  std::string closer(int64_t r) const { return round(r, "closer"); }
  std::string heartbeat(int64_t r, const std::string& node) const {
    return round(r, "hb/" + node);
  }
  std::string dead_closed(int64_t r) const { return round(r, "dead_closed"); }
  std::string dead_seen(int64_t r) const { return round(r, "dead_seen"); }
  std::string closed(int64_t r) const { return round(r, "closed"); }
  std::string assignment(int64_t r, int64_t closer, const std::string& node) const {
    return round(r, "a" + std::to_string(closer) + "/" + node);
  }
  std::string members(int64_t r, int64_t closer) const { return round(r, "m" + std::to_string(closer)); }
  std::string end(int64_t r) const { return round(r, "end"); }
  std::string end_seen(int64_t r, const std::string& node) const { return round(r, "end_seen/" + node); }
  std::string dead(int64_t r, const std::string& node) const { return round(r, "dead/" + node); }
  std::string outcome(int64_t r, const std::string& node) const { return round(r, "outcome/" + node); }
  std::string exited(int64_t r, const std::string& node) const { return round(r, "exited/" + node); }
  std::string generation(int64_t r, int64_t g, const std::string& key) const {
    return round(r, "gen/" + std::to_string(g) + "/" + key);
  }
  std::string rank_failure(int64_t r, int64_t g) const { return generation(r, g, "failed"); }
  std::string generation_joined(int64_t r, int64_t g) const { return generation(r, g, "joined"); }
  std::string generation_formed(int64_t r, int64_t g) const { return generation(r, g, "formed"); }
  std::string introspect(int64_t r) const { return job("introspect/round_" + std::to_string(r) + "/"); }

 private:
  std::string base_;
};

// The status board of one round (see above); `prefix` is
// JobKeys::introspect(round).
class BoardKeys {
 public:
  explicit BoardKeys(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string node(int node) const { return prefix_ + "node/" + std::to_string(node); }
  std::string stacks_count(int node) const { return prefix_ + "stacks/count/" + std::to_string(node); }
  std::string stacks_request(int node, int64_t n) const {
    return prefix_ + "stacks/req/" + std::to_string(node) + "/" + std::to_string(n);
  }
  std::string stacks_reply(const std::string& id, int node) const {
    return prefix_ + "stacks/reply/" + id + "/" + std::to_string(node);
  }

 private:
  std::string prefix_;
};

// The guard exchange of one round (see above); `round_prefix` is the
// round's workers' store prefix (RoundInfo::store_prefix).
class GuardKeys {
 public:
  explicit GuardKeys(const std::string& round_prefix)
      : base_("ddprun-watchdog/" + round_prefix + "guards/") {}
  std::string node(int node) const { return base_ + std::to_string(node); }
  std::string changes() const { return base_ + "changes"; }

 private:
  std::string base_;
};

}  // namespace ddprun::rendezvous
