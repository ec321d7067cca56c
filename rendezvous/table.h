// The server's key-value table and its waiters, without sockets.
//
// execute() answers a request into a response frame, or registers a waiter
// when a blocking request's keys are missing; the write that makes the last
// missing key exist hands the waiter back through its on_ready callback
// (no polling). Single-threaded: the server's event loop owns it.
#pragma once

#include <functional>
#include <list>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rendezvous/wire.h"

namespace ddprun::rendezvous {

class Table {
 public:
  // A blocked get/wait/multi-get. Owned by its connection, which must
  // cancel() it before destroying it.
  struct Waiter {
    const wire::Request* request = nullptr;
    // Called once every key exists; the waiter is unregistered by then.
    std::function<void()> on_ready;
    std::vector<std::pair<std::string, std::list<Waiter*>::iterator>> registered;
  };

  explicit Table(size_t max_bytes = wire::kMaxStoreBytes) : max_bytes_(max_bytes) {}
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;

  // Answers `request` (not kAuth) by appending a response frame to `out`
  // and returns true, or registers `waiter` and returns false.
  bool execute(const wire::Request& request, wire::Bytes& out, Waiter& waiter);
  // Appends the answer of a blocking request whose keys all exist.
  void answer_ready(const wire::Request& request, wire::Bytes& out) const;
  // Carries out a closed connection's kOnClose writes (wire.h, "on close").
  void run_on_close(const wire::Request& on_close);
  // Unregisters a waiter (no-op when not registered).
  void cancel(Waiter& waiter);

  size_t num_keys() const { return data_.size(); }
  size_t num_waiters() const;
  size_t bytes() const { return bytes_; }
  // What one entry costs the heap: its key and value plus the map's node,
  // bucket and allocator overhead. The byte budget is charged with this, so
  // a flood of tiny keys fills it no faster than it fills memory.
  static size_t entry_bytes(size_t key_size, size_t value_size);

 private:
  bool all_present(const std::vector<std::string>& keys) const;
  void register_missing(Waiter& waiter);
  // Stores `value`, charging the byte budget; false when it would overflow.
  bool store(const std::string& key, wire::Bytes value);
  void notify(const std::string& key);

  size_t max_bytes_;
  size_t bytes_ = 0;
  std::unordered_map<std::string, wire::Bytes> data_;
  std::unordered_map<std::string, std::list<Waiter*>> waiters_;
};

// Appends a one-field error / timeout / ok frame.
void write_error(wire::Bytes& out, const std::string& message);

}  // namespace ddprun::rendezvous
