// The Store interface on etcd v3, through its HTTP/JSON gateway
// (etcd_gateway.h: endpoints, deadlines, TLS, authentication), so the
// elastic rendezvous (rendezvous.h) can run on an etcd cluster users
// already operate: no training node hosts the store, so any node may die.
//
// Compare-and-set and add are etcd transactions (compare on the value, or
// on create_revision == 0 for "absent"; add retries on a lost race).
// Blocking reads (get, wait) poll every poll_interval up to their timeout.
// Keys and values are base64 on the wire, as the gateway wants.
//
// Death notices (set_on_close) ride on an etcd lease: the armed writes are
// kept in "<dir>on_close/<lease>" (dir: the first key's folder) beside a
// marker "<dir>on_close/<lease>/alive" bound to the lease, which this store
// keeps alive while it is used. When the lease ends without a goodbye (the
// process died: etcd expires it after its TTL, the keep-alive window; or
// it was revoked), the marker vanishes, and the next participant that
// calls settle_closed(dir) applies the writes in one transaction, exactly
// once. Thread-compatible: one EtcdStore per thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "rendezvous/etcd_gateway.h"
#include "rendezvous/store.h"

namespace ddprun::rendezvous {

class EtcdStore : public Store {
 public:
  // Parses the endpoints (StoreError naming a bad one); connects lazily.
  explicit EtcdStore(EtcdOptions options);
  // Revokes an armed lease: the death notice then fires at once.
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
  // In transactions of up to 128 puts (etcd's default --max-txn-ops), not
  // one request a key: a round's closer writes 2N + 1 keys.
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  int64_t num_keys() override;
  void ping() override;
  bool set_on_close(const std::vector<std::string>& keys, const std::vector<Bytes>& values,
                    const std::string& counter) override;
  bool settle_closed(const std::string& dir) override;
  // Also the retry window while etcd is unreachable, and the lease's TTL.
  void set_reply_window(Duration window) override;

  // The address this host's connection to etcd leaves from ("" before the
  // first call).
  std::string local_address() const;
  int64_t remove_prefix(const std::string& prefix) override;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::rendezvous
