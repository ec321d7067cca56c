#include "trainer/c10d_store_adapter.h"

#include "trainer/error.h"

namespace ddprun::trainer {

C10dStoreAdapter::C10dStoreAdapter(std::shared_ptr<rendezvous::Store> store,
                                   std::chrono::milliseconds timeout)
    : c10d::Store(timeout), store_(std::move(store)) {
  if (!store_) throw TrainerError("C10dStoreAdapter: no store given");
}

C10dStoreAdapter::~C10dStoreAdapter() = default;

c10::intrusive_ptr<c10d::Store> C10dStoreAdapter::clone() {
  auto copy = c10::make_intrusive<C10dStoreAdapter>(store_, getTimeout());
  copy->mu_ = mu_;
  return copy;
}

std::chrono::milliseconds C10dStoreAdapter::effective(std::chrono::milliseconds t) const {
  return t == kNoTimeout ? kNoTimeoutCap : t;
}

void C10dStoreAdapter::set(const std::string& key, const std::vector<uint8_t>& value) {
  std::lock_guard<std::mutex> lock(*mu_);
  store_->set(key, value);
}

std::vector<uint8_t> C10dStoreAdapter::compareSet(const std::string& key,
                                                  const std::vector<uint8_t>& expected,
                                                  const std::vector<uint8_t>& desired) {
  std::lock_guard<std::mutex> lock(*mu_);
  return store_->compare_set(key, expected, desired);
}

std::vector<uint8_t> C10dStoreAdapter::get(const std::string& key) {
  std::lock_guard<std::mutex> lock(*mu_);
  return store_->get(key, effective(timeout_));
}

int64_t C10dStoreAdapter::add(const std::string& key, int64_t value) {
  std::lock_guard<std::mutex> lock(*mu_);
  return store_->add(key, value);
}

bool C10dStoreAdapter::deleteKey(const std::string& key) {
  std::lock_guard<std::mutex> lock(*mu_);
  return store_->remove(key);
}

bool C10dStoreAdapter::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(*mu_);
  return store_->check(keys);
}

int64_t C10dStoreAdapter::getNumKeys() {
  std::lock_guard<std::mutex> lock(*mu_);
  return store_->num_keys();
}

void C10dStoreAdapter::wait(const std::vector<std::string>& keys) {
  wait(keys, timeout_);
}

void C10dStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  std::lock_guard<std::mutex> lock(*mu_);
  store_->wait(keys, effective(timeout));
}

}  // namespace ddprun::trainer
