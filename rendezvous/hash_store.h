// In-memory twin of the TCP store for tests (gloo's hash_store.h).
// Thread-safe: several threads may share one instance, and a set() wakes
// the threads blocked in get()/wait() on that key.
#pragma once

#include <map>

#include "base/mutex.h"
#include "rendezvous/store.h"

namespace ddprun::rendezvous {

class HashStore : public Store {
 public:
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Duration timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool remove(const std::string& key) override;
  int64_t num_keys() override;
  void append(const std::string& key, const Bytes& value) override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys, Duration timeout) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;

 private:
  // Waits until every key exists; TimeoutError names them.
  void wait_locked(const std::vector<std::string>& keys, Duration timeout) REQUIRES(mu_);
  bool present_locked(const std::vector<std::string>& keys) const REQUIRES(mu_);

  base::Mutex mu_;
  base::CondVar changed_;  // notified on every write
  std::map<std::string, Bytes> data_ GUARDED_BY(mu_);
};

// "'a', 'b', ... (n keys)": how errors name a list of keys.
std::string describe_keys(const std::vector<std::string>& keys);

}  // namespace ddprun::rendezvous
