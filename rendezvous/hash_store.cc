#include "rendezvous/hash_store.h"

#include <charconv>

namespace ddprun::rendezvous {

std::string describe_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < 3; ++i) s += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > 3) s += ", ... (" + std::to_string(keys.size()) + " keys)";
  return s;
}

bool HashStore::present_locked(const std::vector<std::string>& keys) const {
  for (const auto& k : keys) {
    if (!data_.count(k)) return false;
  }
  return true;
}

void HashStore::wait_locked(const std::vector<std::string>& keys, Duration timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!present_locked(keys)) {
    if (!changed_.wait_until(mu_, deadline) && !present_locked(keys)) {
      throw TimeoutError("hash store: wait for " + describe_keys(keys) + " timed out after " +
                         std::to_string(timeout.count()) + " ms");
    }
  }
}

void HashStore::set(const std::string& key, const Bytes& value) {
  base::MutexLock lock(mu_);
  data_[key] = value;
  changed_.notify_all();
}

Bytes HashStore::get(const std::string& key, Duration timeout) {
  base::MutexLock lock(mu_);
  wait_locked({key}, timeout);
  return data_.at(key);
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  base::MutexLock lock(mu_);
  int64_t v = 0;
  auto it = data_.find(key);
  if (it != data_.end()) {
    const char* b = reinterpret_cast<const char*>(it->second.data());
    auto [p, ec] = std::from_chars(b, b + it->second.size(), v);
    if (ec != std::errc() || p != b + it->second.size()) {
      throw StoreError("hash store: add: value at '" + key + "' is not an integer");
    }
  }
  // As the server does: refuse rather than overflow (signed overflow is UB).
  if (__builtin_add_overflow(v, delta, &v))
    throw StoreError("hash store: add: integer overflow at '" + key + "'");
  data_[key] = to_bytes(std::to_string(v));
  changed_.notify_all();
  return v;
}

Bytes HashStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  base::MutexLock lock(mu_);
  auto it = data_.find(key);
  if ((it == data_.end() && expected.empty()) || (it != data_.end() && it->second == expected)) {
    data_[key] = desired;
    changed_.notify_all();
    return desired;
  }
  return it == data_.end() ? Bytes{} : it->second;
}

void HashStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  base::MutexLock lock(mu_);
  wait_locked(keys, timeout);
}

bool HashStore::check(const std::vector<std::string>& keys) {
  base::MutexLock lock(mu_);
  return present_locked(keys);
}

bool HashStore::remove(const std::string& key) {
  base::MutexLock lock(mu_);
  return data_.erase(key) > 0;
}

int64_t HashStore::num_keys() {
  base::MutexLock lock(mu_);
  return static_cast<int64_t>(data_.size());
}

void HashStore::append(const std::string& key, const Bytes& value) {
  base::MutexLock lock(mu_);
  auto& v = data_[key];
  v.insert(v.end(), value.begin(), value.end());
  changed_.notify_all();
}

std::vector<Bytes> HashStore::multi_get(const std::vector<std::string>& keys, Duration timeout) {
  base::MutexLock lock(mu_);
  wait_locked(keys, timeout);
  std::vector<Bytes> out;
  for (const auto& k : keys) out.push_back(data_.at(k));
  return out;
}

void HashStore::multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  if (keys.size() != values.size()) throw StoreError("hash store: multi_set: keys/values differ in size");
  base::MutexLock lock(mu_);
  for (size_t i = 0; i < keys.size(); ++i) data_[keys[i]] = values[i];
  changed_.notify_all();
}

}  // namespace ddprun::rendezvous
