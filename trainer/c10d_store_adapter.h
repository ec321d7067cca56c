// Gives c10d (ProcessGroupGloo) our rendezvous store.
//
// Under ddprun the job has one rendezvous endpoint, our store
// (rendezvous/store.h); c10d's process groups want a c10d::Store. This
// adapter forwards set/get/add/compareSet/check/wait/deleteKey/getNumKeys
// (and clone, for torch 2.x).
// Timeouts: c10d's get() and wait(keys) use the store's own timeout
// (setTimeout); c10d's kNoTimeout (zero) becomes kNoTimeoutCap, because
// every wait in ddprun has a deadline. Our TimeoutError and StoreError pass
// through unchanged (both are std::runtime_error).
//
// Thread safety: rendezvous::Store is thread-compatible only, and c10d may
// call from its worker threads, so every call is serialised by a mutex.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "rendezvous/store.h"

namespace ddprun::trainer {

// What "no timeout" means on our store.
inline constexpr std::chrono::milliseconds kNoTimeoutCap = std::chrono::hours(24);

class C10dStoreAdapter : public c10d::Store {
 public:
  C10dStoreAdapter(std::shared_ptr<rendezvous::Store> store,
                   std::chrono::milliseconds timeout);
  ~C10dStoreAdapter() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key,
                                  const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;
  // torch 2.x's c10d::Store::clone (pure there, absent in 1.13, hence no
  // `override`): another handle on the same connection and lock.
  virtual c10::intrusive_ptr<c10d::Store> clone();

 private:
  std::chrono::milliseconds effective(std::chrono::milliseconds t) const;

  std::shared_ptr<std::mutex> mu_ = std::make_shared<std::mutex>();  // shared with clones
  std::shared_ptr<rendezvous::Store> store_;  // guarded by *mu_
};

}  // namespace ddprun::trainer
