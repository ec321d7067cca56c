// The multi-node rendezvous handler: the agent's RendezvousHandler and
// AgentHooks over rendezvous::Rendezvous (rendezvous/rendezvous.h).
//
// Store: with --rdzv-backend=etcd, an etcd cluster (rendezvous_store.h):
// no agent hosts anything, every agent is a client, so the death of any
// node, the first included, leaves the others able to re-form. Otherwise
// ddprun's TCP store: the agent whose address matches --rdzv-endpoint
// hosts it on its own thread (store_host.h), like torchrun's c10d backend:
// `is_host` in
// --rdzv-conf decides when given; otherwise an agent hosts when HOST is one
// of this machine's addresses and it can bind PORT (a second agent on the
// same machine finds the port taken and joins as a client). The others
// connect, waiting up to join_timeout for the store to come up.
//
// Rounds: next_round() joins a round and starts its KeepAlive. KeepAlive's
// report (a peer's failure or silence, a scale-up, the store lost) is
// posted into the agent's loop and fails the local attempt with the reason;
// a local worker failure ends the round for everyone (signal_failure), with
// ddprun's exit status carried in the reason so every agent exits alike.
// TORCHELASTIC_RESTART_COUNT is the job-wide count kept in the store, so the
// restart policy spends one budget for the whole job; a scale-up restarts
// without asking it. A job ends when every node's workers succeed (the exit
// barrier: each waits, up to 300 s, for every node's outcome), or when the
// policy stops on every node at the same count.
//
// Threads: next_round() and group_ended() (joins, the exit barrier) run on
// a thread of the agent's (Agent::off_loop, while the loop keeps handling
// signals), the hooks on the agent's loop thread; a failure the hooks
// report goes to the store from a notifier thread, which group_ended() and
// next_round() wait for. The KeepAlive callback runs on KeepAlive's thread
// and only records and posts. The generation counter (under mu_) orders
// them: group_ended() and next_round() bump it, and a report of an older
// generation does nothing. abandon() (a stop signal) cancels every store
// connection at once; the destructor then tells the round's other nodes.
// finish_job() (the exit hand-shake) runs off the loop like the joins.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "agent/hooks.h"
#include "agent/options.h"
#include "agent/port_reservation.h"
#include "agent/rendezvous_store.h"
#include "agent/rendezvous_handler.h"
#include "agent/store_host.h"
#include "base/mutex.h"
#include "rendezvous/canceller.h"
#include "rendezvous/job_protocol.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/succession.h"

namespace ddprun::agent {

class ElasticRendezvous : public RendezvousHandler, public AgentHooks {
 public:
  // Parses the endpoint and --rdzv-conf, hosts or reaches the store (up to
  // join_timeout). Throws RendezvousError naming the culprit.
  explicit ElasticRendezvous(const Options& options);
  ~ElasticRendezvous() override;
  ElasticRendezvous(const ElasticRendezvous&) = delete;
  ElasticRendezvous& operator=(const ElasticRendezvous&) = delete;

  // The agent's loop, where KeepAlive's reports are handled. Call before
  // Agent::run().
  void attach(boost::asio::io_context& io) { io_ = &io; }

  // RendezvousHandler
  RoundInfo next_round(int restart_count) override;
  GroupVerdict group_ended(GroupOutcome outcome) override;
  std::string run_id() const override { return options_.run_id; }
  void abandon(int signal) override;
  void finish_job() override;

  // AgentHooks
  void workers_started(const AttemptInfo& attempt, AttemptControl& control) override;
  void attempt_failed(const Failure& root) override;
  void attempt_interrupted(int signal) override;
  void attempt_ended(const AttemptResult& result) override;

  bool is_host() const { return host_ != nullptr; }
  // "host:port" of the store, as errors name it.

 private:
  // `cancellable`: abandon() shuts the connection down. KeepAlive's is not:
  // its calls are short anyway, and it must disarm its death notice (so
  // that farewell()'s reason, with the exit status, is the one peers see).
  std::unique_ptr<rendezvous::Store> connect(rendezvous::Duration connect_timeout,
                                             bool cancellable = true);
  void on_round_end(uint64_t generation, const rendezvous::RoundEnd& end);  // KeepAlive thread
  void apply_end(uint64_t generation);
  // Publishes this node's record (reason without the node's name) from a
  // notifier thread.
  void signal_failure(rendezvous::RoundEnd end);
  void linger_after_failed_join();
  // etcd: marks this node out of the finished job; the last one out
  // deletes the job's keys.
  void forget_finished_job();
  // On the way out: after abandon(), ends the running round for the other
  // nodes with this node's signalled record; on the store's host, lingers
  // (bounded) until they have read the round's end or are gone.
  void farewell();
  // What the store's port does now (store_succession.cc).
  enum class Reach { kAnswers, kGone, kSilent };
  // After the store was lost: waits (join_timeout) until its port accepts
  // a connection again (kAnswers); kGone at once when the store's host
  // refuses it (the host is up and nothing listens: the store is gone for
  // good); kSilent when the time passes or when abandoned. Our TCP store
  // only.
  Reach store_reachable_again();
  // One connection attempt to the store's port within `limit`.
  Reach probe_store_port(rendezvous::Duration limit) const;
  // How this node serves ddprun's store: every address of the endpoint's
  // family, its port, the job's token (the host, and a successor).
  StoreHostOptions store_options() const;
  // The job-wide budget allows one more restart than the last round's count.
  bool restart_left() const { return restart_count_ + 1 <= options_.max_restarts; }
  // After a round formed: keeps its Standby when this node is its
  // successor (reads the members), else drops it.
  void stand_by();
  // The successor of the round (this node) starts serving the store with
  // the job's state (rendezvous/succession.h); true when it serves now.
  bool take_over_store();
  // The store's host is gone: every member goes to the successor's store
  // (the successor takes it over first) and re-forms, one restart spent.
  // nullopt when the round names no successor, or this node was to be it
  // and cannot serve the store.
  std::optional<GroupVerdict> fail_over(const std::string& why);
  // The round's end for a node that lost the store: rejoin, fail over or exit.
  GroupVerdict after_store_lost(const rendezvous::RoundEnd& end);
  // Records "ok" and waits for every node's outcome; true when all are ok.
  bool exit_barrier();
  std::string me() const;
  // The reason and exit status a round end means for this node.
  FailRequest fail_request(const rendezvous::RoundEnd& end) const;
  // With a peer stopped by a handled signal: forward that signal first.
  void forward_peer_signal(const rendezvous::RoundEnd& end, FailRequest& req) const;

  Options options_;
  rendezvous::JobKeys keys_;  // the job's store keys
  RendezvousStoreSpec spec_;  // our TCP store or etcd
  std::string host_name_;  // the endpoint's HOST
  uint16_t port_ = 0;
  std::string store_addr_;
  std::string token_;
  rendezvous::Duration keep_alive_window_{15000};
  std::unique_ptr<StoreHost> host_;
  // Set while this node is the round's store successor (succession.h).
  std::optional<rendezvous::Standby> standby_;
  bool took_over_ = false;  // this node serves the store since its host died this round
  int restart_count_ = 0;  // the job-wide count as the last round formed
  // How long a fresh connection waits for the store to come up: the join's
  // join_timeout, shorter while a successor's store is awaited.
  rendezvous::Duration store_patience_{600000};
  std::unique_ptr<PortReservation> master_port_;
  // c10d's TCPStore on MASTER_PORT (store_host.h), for the workers.
  std::unique_ptr<StoreHost> tcpstore_host_;
  std::unique_ptr<rendezvous::Rendezvous> rdzv_;
  std::unique_ptr<rendezvous::Store> control_;  // exit hand-shake
  std::unique_ptr<rendezvous::KeepAlive> keep_alive_;
  // Shared by every store connection of this node: abandon() cancels them.
  std::shared_ptr<rendezvous::Canceller> canceller_ = std::make_shared<rendezvous::Canceller>();
  std::thread notifier_;  // signal_failure's store call
  std::atomic<int> stop_signal_{0};  // the signal that abandoned a call
  std::optional<rendezvous::RoundResult> round_;
  boost::asio::io_context* io_ = nullptr;
  AttemptControl* control_attempt_ = nullptr;
  bool round_over_ = false;  // this node already ended or stopped for the round
  std::optional<rendezvous::RoundEnd> local_end_;
  bool drain_ = false;  // every node of the last round recorded its outcome
  bool reconnect_ = false;  // the store was lost and reached again: fresh connections
  bool store_closed_ = false;  // the round's end said its host left with the store

  base::Mutex mu_;  // the two below are written by KeepAlive's thread too
  uint64_t generation_ GUARDED_BY(mu_) = 0;
  std::optional<rendezvous::RoundEnd> remote_end_ GUARDED_BY(mu_);
};

}  // namespace ddprun::agent
