#include "rendezvous/store.h"

namespace ddprun::rendezvous {

void Store::append(const std::string& key, const Bytes& value) {
  // Optimistic loop: compare_set fails only when another writer got there first.
  Bytes current = check({key}) ? get(key, Duration(0)) : Bytes{};
  for (;;) {
    Bytes desired = current;
    desired.insert(desired.end(), value.begin(), value.end());
    if (desired.empty()) desired = value;
    Bytes after = compare_set(key, current, desired);
    if (after == desired) return;
    current = std::move(after);
  }
}

std::vector<Bytes> Store::multi_get(const std::vector<std::string>& keys, Duration timeout) {
  wait(keys, timeout);
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (const auto& k : keys) values.push_back(get(k, timeout));
  return values;
}

void Store::multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  if (keys.size() != values.size()) {
    throw StoreError("multi_set: " + std::to_string(keys.size()) + " keys but " +
                     std::to_string(values.size()) + " values");
  }
  for (size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
}

}  // namespace ddprun::rendezvous
