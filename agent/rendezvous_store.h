// Where the agent's multi-node rendezvous store is and how to reach it:
// ddprun's own TCP store (backends c10d and static: the agent at the
// endpoint hosts it) or an etcd cluster (backend etcd, torchrun's etcd-v2
// spelling too: nothing runs on a training node, so any node may die).
//
// etcd's settings come from --rdzv-conf, torchrun's names: cacert, cert,
// key (PEM files; a CA, or https:// endpoints, turn TLS on) and user (etcd
// authentication; the password is the rendezvous token, DDPRUN_RDZV_TOKEN
// or token=, kept out of process listings and logs).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "agent/options.h"
#include "rendezvous/canceller.h"
#include "rendezvous/etcd_gateway.h"
#include "rendezvous/store.h"

namespace ddprun::agent {

struct RendezvousStoreSpec {
  bool etcd = false;
  // Our TCP store: HOST:PORT of --rdzv-endpoint and the shared secret.
  std::string host;
  uint16_t port = 0;
  std::string token;
  // etcd: endpoints, TLS files, user and password.
  rendezvous::EtcdOptions etcd_options;
  // How errors name the store: "HOST:PORT" or "etcd at EP,EP".
  std::string address;
};

// True for the backends served by etcd ("etcd", "etcd-v2").
bool is_etcd_backend(const std::string& backend);

// Reads the backend, endpoint, token and etcd's --rdzv-conf keys. Throws
// RendezvousError naming a bad endpoint or an etcd key given to another
// backend.
RendezvousStoreSpec rendezvous_store_spec(const Options& options, int default_port);

// A fresh connection. `connect_timeout`: how long to wait for the store to
// come up (a TCP store's host starting; etcd unreachable); `op_timeout`:
// each call's deadline. `canceller` (may be null) abandons blocked calls.
// Throws StoreError.
std::unique_ptr<rendezvous::Store> open_rendezvous_store(
    const RendezvousStoreSpec& spec, rendezvous::Duration connect_timeout,
    rendezvous::Duration op_timeout, std::shared_ptr<rendezvous::Canceller> canceller);

// Connects (waiting up to `connect_timeout`) and returns the local address
// the connection leaves from: one the other nodes can reach this host at.
// Throws StoreError.
std::string probe_rendezvous_store(const RendezvousStoreSpec& spec,
                                   rendezvous::Duration connect_timeout);

// probe_rendezvous_store for an agent that was to host our TCP store but
// found its port taken. Usually another agent of the job on this machine
// took it first and serves the store there; but any socket on that port
// (another program's listener, or its outgoing connection that left from
// it) takes it just as well, and then no agent would ever host. So the
// probe runs in short slices until `join_timeout`, and after each failed
// one `host_now()` tries to host again: once it returns true (the port
// came free and this agent now serves the store) the probe finds that
// store. A wrong token ends it at once (AuthError); after 10 s of failed
// slices one warning names the port. Throws the last slice's StoreError.
std::string probe_or_host_rendezvous_store(const RendezvousStoreSpec& spec,
                                           rendezvous::Duration join_timeout,
                                           const std::function<bool()>& host_now);

}  // namespace ddprun::agent
