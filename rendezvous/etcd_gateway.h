// One connection at a time to an etcd cluster's HTTP/JSON gateway (etcd v3:
// POST /v3/<service>/<call> with a JSON body), for EtcdStore.
//
// Endpoints are tried in order; one that refuses, fails TLS or times out is
// skipped for the next, and the error names every endpoint tried. Every
// request has a deadline (connect, TLS handshake, send and reply together:
// async I/O on a private io_context, so the deadline holds even in a
// blocking call). TLS is used for https:// endpoints or when a CA is given:
// the server's certificate is checked against the CA and the endpoint's
// host name; a client certificate and key are sent when given. With a user,
// the gateway's auth token is fetched (/v3/auth/authenticate) before the
// first call and again when etcd says it is no longer valid.
//
// While etcd is unreachable (every endpoint refuses the connection, or
// answers 503 Unavailable: starting, no leader), calls are retried for up to `retry_window` (set by the keep-alive: a restart of
// etcd within its window is ridden out). A request that reached etcd is
// never retried: its effect may have happened.
//
// Thread-compatible: one EtcdGateway per thread.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "rendezvous/canceller.h"
#include "rendezvous/store.h"

namespace ddprun::rendezvous {

struct EtcdOptions {
  // "host:port,host:port" (torchrun's --rdzv-endpoint for etcd); each may
  // start with http:// or https://; the port defaults to 2379.
  std::string endpoints;
  // Deadline of each HTTP request (connect + TLS + send + reply).
  Duration request_timeout{5000};
  // Blocking reads (get, wait) re-check this often.
  Duration poll_interval{20};
  // TLS (--rdzv-conf cacert=, cert=, key=, torchrun's names): PEM files.
  // A CA turns TLS on for every endpoint; without one, https:// endpoints
  // are checked against the system's CAs.
  std::string cacert;
  std::string cert;
  std::string key;
  // etcd authentication (--rdzv-conf user=; the password from
  // DDPRUN_ETCD_PASSWORD or password=). Empty: none.
  std::string user;
  std::string password;
  // Cancels blocked calls from another thread (canceller.h); may be null.
  std::shared_ptr<Canceller> canceller;
};

class EtcdGateway {
 public:
  // Parses the endpoints and loads the TLS files; StoreError naming a bad
  // endpoint or file. Connects lazily.
  explicit EtcdGateway(EtcdOptions options);
  ~EtcdGateway();
  EtcdGateway(const EtcdGateway&) = delete;
  EtcdGateway& operator=(const EtcdGateway&) = delete;

  // POSTs `body` to `path` ("/v3/kv/range"); returns the reply's JSON.
  // `what` names the operation in errors. StoreError (CancelledError once
  // cancelled) when every endpoint failed or etcd refused the request.
  nlohmann::json post(const std::string& path, const nlohmann::json& body, const std::string& what);

  // How long calls keep retrying while no endpoint accepts a connection.
  void set_retry_window(Duration window) { retry_window_ = window; }
  Duration retry_window() const { return retry_window_; }
  // The address this host's connection to etcd leaves from ("" before the
  // first call): one the other nodes can reach, even on multi-NIC hosts.
  std::string local_address() const { return local_address_; }
  const EtcdOptions& options() const { return options_; }

  struct Impl;

 private:
  EtcdOptions options_;
  Duration retry_window_{0};
  std::string local_address_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::rendezvous
