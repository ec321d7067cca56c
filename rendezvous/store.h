// The key-value store interface every rendezvous participant talks to.
//
// Modelled on gloo's rendezvous/store.h: a handful of blocking calls, each
// with a deadline. Implementations: the TCP client (client.h), etcd
// (etcd_store.h) and, for tests, an in-memory twin (hash_store.h);
// PrefixStore scopes keys the way gloo's prefix_store.h does.
// Implementations are thread-compatible, not thread-safe: give each thread
// its own client.
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddprun::rendezvous {

using Bytes = std::vector<uint8_t>;
using Duration = std::chrono::milliseconds;

// Thrown when a deadline passes; the message names the keys and the timeout.
class TimeoutError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A key as error messages show it: quoted, and cut at 128 bytes (a key can
// be as long as a value).
inline std::string quoted_key(const std::string& key) {
  return "'" + key.substr(0, 128) + (key.size() > 128 ? "...'" : "'");
}

// Thrown for every other failure (connection, protocol, refused token); the
// message names the peer address and the operation.
class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The store and this node disagree on the token (refused, missing, or a
// store that cannot prove it knows it): retrying cannot help, and the fix
// is the same token on every node.
class AuthError : public StoreError {
 public:
  using StoreError::StoreError;
};

// A store this client was connected to refuses new connections: its host is
// up and nothing listens on the port, so the store is gone for good (its
// process died or closed it). Told apart from a store that does not answer
// (a partition, a paused host), which may come back.
class StoreGoneError : public StoreError {
 public:
  using StoreError::StoreError;
};

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Blocks until `key` exists or `timeout` passes (TimeoutError).
  virtual Bytes get(const std::string& key, Duration timeout) = 0;
  // Atomically adds `delta` to the integer stored at `key` (0 if absent) and
  // returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Sets `key` to `desired` if its value is `expected` (an empty `expected`
  // means "absent"); returns the value after the call.
  virtual Bytes compare_set(const std::string& key, const Bytes& expected,
                            const Bytes& desired) = 0;
  // Blocks until every key exists or `timeout` passes (TimeoutError).
  virtual void wait(const std::vector<std::string>& keys, Duration timeout) = 0;
  // True when every key exists; never blocks.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // True when the key existed.
  virtual bool remove(const std::string& key) = 0;
  virtual int64_t num_keys() = 0;

  // Added operations, with portable defaults built on the ones above so an
  // implementation (or a test fake) need not provide them. The TCP client
  // overrides each with a single round trip.

  // Appends `value` to the value at `key` (creating it when absent).
  virtual void append(const std::string& key, const Bytes& value);
  // Blocks until every key exists, then returns their values in order.
  virtual std::vector<Bytes> multi_get(const std::vector<std::string>& keys, Duration timeout);
  // Sets every key to its value (keys.size() == values.size()).
  virtual void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values);
  // Round trip to the store; throws StoreError when it is unreachable.
  virtual void ping() {}
  // Leaves writes with the store for when this connection closes without
  // a goodbye (the process died, the link broke): when keys[0] is absent,
  // every pair is set and `counter` (when not empty) gets 1 added; when it
  // is set already, keys[1] alone (a death mark). Empty `keys` cancels.
  // Returns false where the store cannot (heartbeats alone find death).
  virtual bool set_on_close(const std::vector<std::string>& /*keys*/,
                            const std::vector<Bytes>& /*values*/,
                            const std::string& /*counter*/) {
    return false;
  }
  // Applies the set_on_close writes of participants whose session ended
  // without a goodbye, where the store cannot apply them itself (etcd: a
  // lease that expired or was revoked, see etcd_store.h). `dir` is the
  // folder of those writes' first key ("rdzv/job/r3/"). Returns true when
  // this store needs such calls (the caller then makes them often); false
  // where the store applies the writes the moment a connection closes.
  virtual bool settle_closed(const std::string& /*dir*/) { return false; }
  // How long this connection waits for any reply (beyond a blocking call's
  // own timeout) before it counts the store as gone. The keep-alive sets its
  // window here, so a slow reply the settings allow ends nothing. No-op
  // where replies cannot be late (in-memory stores).
  virtual void set_reply_window(Duration /*window*/) {}
  // Deletes every key that starts with `prefix` and returns how many, or -1
  // where the store cannot (our TCP store: it goes with its job anyway).
  // A store that outlives jobs (etcd) implements it, so a finished job
  // leaves nothing behind.
  virtual int64_t remove_prefix(const std::string& /*prefix*/) { return -1; }
};

// Text <-> Bytes helpers for callers that store strings.
inline Bytes to_bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }
inline std::string to_string(const Bytes& b) { return std::string(b.begin(), b.end()); }

}  // namespace ddprun::rendezvous
