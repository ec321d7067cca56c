// The TCPStore protocol's queries answered on the store's table
// (rendezvous/table.h), without sockets: what tcpstore_server.cc runs for
// each parsed query (tcpstore_codec.h), and what the TCPStore fuzzer drives
// directly.
//
// Semantics follow torch's libuv server: GET of a missing key answers an
// empty value; WAIT registers and is answered once every key exists (a
// non-empty queue counts as its key existing); every write to a key answers
// the waits registered on it whose keys now all exist (BARRIER's arrivals
// wait on the count's key, so the write that completes the count answers
// them all); a QUEUE_PUSH answers one waiter of its queue. The queues'
// bytes are charged to the table's budget. Replies are appended to the
// caller's buffer in the codec's bytes; a waiter's reply comes through its
// on_ready.
//
// Not thread-safe: the server's event loop owns it.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "rendezvous/table.h"
#include "rendezvous/tcpstore_codec.h"

namespace ddprun::rendezvous::tcpstore {

class Executor {
 public:
  // A connection's blocked WAIT or BARRIER. Owned by the connection, which
  // must cancel() it before destroying it.
  struct Waiter {
    // Called once the wait is over, with its reply, after the waiter was
    // unregistered; may call back into the executor.
    std::function<void(const Bytes& reply)> on_ready;

   private:
    friend class Executor;
    size_t awaited = 0;              // registrations not answered yet
    std::vector<std::string> keys;   // the keys registered on, once per naming
  };

  explicit Executor(size_t max_store_bytes);
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Answers `query` into `out` (moving its values into the table), or
  // registers `waiter`. False, with `refusal` saying why, when the query
  // must close its connection (a bad VALIDATE magic, a full table, ADD on
  // a value that is no integer, WATCH_KEY).
  bool execute(Request& query, Bytes& out, Waiter& waiter, std::string& refusal);
  // Drops `waiter`'s registrations (no-op when it has none).
  void cancel(Waiter& waiter);
  // Empties the table and the queues; waiters stay registered.
  void clear();

  size_t num_keys() const { return table_.num_keys(); }
  // Waiters blocked in WAIT or BARRIER.
  size_t num_waiters() const { return num_waiters_; }
  // Bytes the table holds, keys, values and queues.
  size_t bytes() const { return table_.bytes(); }

 private:
  bool present(const std::string& key) const;
  // Registers `waiter` on `key` (once more when it names it again).
  void await(Waiter& waiter, const std::string& key);
  // Answers the waiters of `key` whose every key now exists / the first.
  void wake(const std::string& key);
  void wake_one(const std::string& key);
  // Unregisters a waiter whose registrations were all answered, and
  // hands it its reply.
  void finish(Waiter& waiter);
  // A write's result: wakes the waiters of `key` when it was stored;
  // otherwise false, with the refusal of a full store.
  bool written(Table::Write result, const std::string& key, std::string& refusal);
  bool compare_set(Request& q, Bytes& out, std::string& refusal);
  bool add(Request& q, Bytes& out, std::string& refusal);
  bool wait(Request& q, Bytes& out, Waiter& waiter);
  bool barrier(Request& q, Waiter& waiter, std::string& refusal);
  bool queue_push(Request& q, std::string& refusal);
  void queue_pop(Request& q, Bytes& out);

  Table table_;
  std::unordered_map<std::string, std::deque<Bytes>> queues_;
  // Per key, the waiters registered on it (a waiter once per time it named
  // the key, as torch counts).
  std::unordered_map<std::string, std::vector<Waiter*>> waiting_;
  size_t num_waiters_ = 0;
};

}  // namespace ddprun::rendezvous::tcpstore
