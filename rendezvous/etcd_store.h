// The Store interface on etcd v3, through its HTTP/JSON gateway
// (/v3/kv/range, /v3/kv/put, /v3/kv/txn, /v3/kv/deleterange), so the
// elastic rendezvous (rendezvous.h) can run on an etcd cluster users
// already operate: no training node hosts the store, so any node may die.
//
// Every request has a deadline; an endpoint that refuses or times out is
// skipped for the next one in the list, and the error names every endpoint
// tried. Compare-and-set and add are etcd transactions (compare on the
// value or on create_revision == 0 for "absent"; add retries on a lost
// race). Blocking reads (get, wait) poll with a short interval up to their
// timeout. Keys and values are base64 on the wire, as the gateway wants.
// No death notice on close (set_on_close returns false): heartbeats find
// dead members. Thread-compatible: one EtcdStore per thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "rendezvous/store.h"

namespace ddprun::rendezvous {

struct EtcdOptions {
  // "host:port,host:port" (torchrun's --rdzv-endpoint for etcd), http only.
  std::string endpoints;
  // Deadline of each HTTP request (connect + send + reply).
  Duration request_timeout{5000};
  // Blocking reads re-check this often.
  Duration poll_interval{20};
};

class EtcdStore : public Store {
 public:
  // Parses the endpoints (StoreError naming a bad one); connects lazily.
  explicit EtcdStore(EtcdOptions options);
  ~EtcdStore() override;
  EtcdStore(const EtcdStore&) = delete;
  EtcdStore& operator=(const EtcdStore&) = delete;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Duration timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool remove(const std::string& key) override;
  int64_t num_keys() override;
  void ping() override;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::rendezvous
