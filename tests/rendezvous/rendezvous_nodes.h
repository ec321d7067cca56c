// Participants of a rendezvous, shared by the rendezvous tests
// (rendezvous_test, keep_alive_test, on_close_test, etcd_test): store
// connections as the agent makes them, one node's options, forming a round
// on several nodes at once, and waiting for a round's end.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "rendezvous/client.h"
#include "rendezvous/rendezvous.h"

namespace ddprun::rendezvous::testing {

// Every call connects a fresh Client to 127.0.0.1:port with these
// timeouts (reply_grace: the client's default unless given).
inline Rendezvous::StoreFactory loopback_clients(uint16_t port, Duration connect_timeout,
                                                 Duration op_timeout,
                                                 Duration reply_grace = ClientOptions{}.reply_grace) {
  ClientOptions c;
  c.host = "127.0.0.1";
  c.port = port;
  c.connect_timeout = connect_timeout;
  c.op_timeout = op_timeout;
  c.reply_grace = reply_grace;
  return [c] { return std::make_unique<Client>(c); };
}

// The deadlines of a scenario, each test's own: how long a round may take
// to form (join, last call) and to close, and how long a member may stay
// silent (keep_alive_interval x keep_alive_attempts) before it is lost.
// Spelled in one place so a test reads its scenario's pace in one line.
struct Deadlines {
  Duration join;                 // join_timeout
  Duration last_call;            // last_call_timeout
  Duration close;                // close_timeout
  Duration keep_alive_interval;  // keep_alive_interval
  int keep_alive_attempts;       // keep_alive_max_attempt
};

// Node `i` of job `run_id` (node<i> at 10.0.0.<i>) for min..max nodes,
// under the scenario's `deadlines`.
inline RendezvousOptions member(int i, int min, int max, const Deadlines& deadlines,
                                const std::string& run_id = "job") {
  RendezvousOptions o;
  o.run_id = run_id;
  o.min_nodes = min;
  o.max_nodes = max;
  o.node_id = "node" + std::to_string(i);
  o.local_addr = "10.0.0." + std::to_string(i);
  o.join_timeout = deadlines.join;
  o.last_call_timeout = deadlines.last_call;
  o.close_timeout = deadlines.close;
  o.keep_alive_interval = deadlines.keep_alive_interval;
  o.keep_alive_max_attempt = deadlines.keep_alive_attempts;
  return o;
}

// Runs next_round on every node at once; each must return within `deadline`.
inline std::vector<RoundResult> form(std::vector<Rendezvous*> nodes,
                                     std::chrono::seconds deadline = std::chrono::seconds(60)) {
  std::vector<std::future<RoundResult>> f;
  for (auto* n : nodes) f.push_back(std::async(std::launch::async, [n] { return n->next_round(); }));
  std::vector<RoundResult> out;
  for (auto& x : f) {
    REQUIRE(x.wait_for(deadline) == std::future_status::ready);
    out.push_back(x.get());
  }
  return out;
}

// The RoundEnd a KeepAlive reports, waited for with a deadline.
struct EndWatch {
  std::promise<RoundEnd> promise;
  std::future<RoundEnd> future = promise.get_future();
  std::function<void(const RoundEnd&)> callback() {
    return [this](const RoundEnd& e) { promise.set_value(e); };
  }
  RoundEnd get(std::chrono::seconds deadline = std::chrono::seconds(20)) {
    REQUIRE(future.wait_for(deadline) == std::future_status::ready);
    return future.get();
  }
};

}  // namespace ddprun::rendezvous::testing
