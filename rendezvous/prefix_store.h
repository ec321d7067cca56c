// A key-prefix view of another store, as gloo's prefix_store.h scopes keys:
// every key is sent as prefix + key, so runs and attempts never collide.
// num_keys() counts the whole underlying store (the wire has no prefix
// count). Thread safety is the inner store's.
#pragma once

#include <memory>
#include <string>

#include "rendezvous/store.h"

namespace ddprun::rendezvous {

class PrefixStore : public Store {
 public:
  // Borrows `inner`, which must outlive this view.
  PrefixStore(std::string prefix, Store& inner) : prefix_(std::move(prefix)), inner_(&inner) {}
  // Owns `inner`.
  PrefixStore(std::string prefix, std::unique_ptr<Store> inner)
      : prefix_(std::move(prefix)), owned_(std::move(inner)), inner_(owned_.get()) {}

  void set(const std::string& key, const Bytes& value) override { inner_->set(k(key), value); }
  Bytes get(const std::string& key, Duration timeout) override { return inner_->get(k(key), timeout); }
  int64_t add(const std::string& key, int64_t delta) override { return inner_->add(k(key), delta); }
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    return inner_->compare_set(k(key), expected, desired);
  }
  void wait(const std::vector<std::string>& keys, Duration timeout) override {
    inner_->wait(k(keys), timeout);
  }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(k(keys)); }
  bool remove(const std::string& key) override { return inner_->remove(k(key)); }
  int64_t num_keys() override { return inner_->num_keys(); }
  void append(const std::string& key, const Bytes& value) override { inner_->append(k(key), value); }
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys, Duration timeout) override {
    return inner_->multi_get(k(keys), timeout);
  }
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override {
    inner_->multi_set(k(keys), values);
  }
  void ping() override { inner_->ping(); }
  bool set_on_close(const std::vector<std::string>& keys, const std::vector<Bytes>& values,
                    const std::string& counter) override {
    return inner_->set_on_close(k(keys), values, counter.empty() ? counter : k(counter));
  }

  bool settle_closed(const std::string& dir) override { return inner_->settle_closed(k(dir)); }
  void set_reply_window(Duration window) override { inner_->set_reply_window(window); }

  const std::string& prefix() const { return prefix_; }
  Store& inner() { return *inner_; }

 private:
  std::string k(const std::string& key) const { return prefix_ + key; }
  std::vector<std::string> k(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& key : keys) out.push_back(prefix_ + key);
    return out;
  }

  std::string prefix_;
  std::unique_ptr<Store> owned_;
  Store* inner_;
};

}  // namespace ddprun::rendezvous
