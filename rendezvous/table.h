// The store's key-value table and its waiters, without sockets: the one
// table of both store servers. ddprun's server asks it in its protocol
// (execute()); the TCPStore server (tcpstore_executor.h) through the
// key-value operations below, words its own replies and keeps its queues'
// bytes in this table's budget (charge/refund).
//
// execute() answers a request into a response frame, or registers a waiter
// when a blocking request's keys are missing; the write that makes the last
// missing key exist hands the waiter its answer through on_ready (no
// polling). Single-threaded: the server's event loop owns it.
//
// Work per request is bounded by that request's own keys: an index from
// each key to the waits on it, and a count of each wait's absent keys, so a
// write that creates (or a delete that removes) a key touches the waits on
// that key only and never rescans a wait's key list. Waiters asking the
// same question (the same op on the same keys, in order: every rank of an
// all-gather) share one registration, one count and one encoded answer, so
// an all-gather of N ranks costs the table O(N) keys, not O(N^2).
#pragma once

#include <functional>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rendezvous/wire.h"

namespace ddprun::rendezvous {

class Table {
  struct Wait;  // one question: op and keys, the waiters asking it

 public:
  using Answer = std::shared_ptr<const wire::Bytes>;
  // A blocked get/wait/multi-get. Owned by its connection, which must
  // cancel() it before destroying it.
  struct Waiter {
    // Called once every key exists, with the encoded response frame (shared
    // by every waiter of the same question); the waiter is unregistered by
    // then. Called after the table is consistent again, and may call back
    // into the table.
    std::function<void(const Answer&)> on_ready;

   private:
    friend class Table;
    Wait* wait = nullptr;
    std::list<Waiter*>::iterator member;
  };

  explicit Table(size_t max_bytes = wire::kMaxStoreBytes);
  ~Table();
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;

  // Answers `request` (not kAuth) by appending a response frame to `out`
  // and returns true, or registers `waiter` and returns false; a blocking
  // request's keys are then moved out of `request` into the table, as are
  // the values of a set or multi-set.
  bool execute(wire::Request& request, wire::Bytes& out, Waiter& waiter);
  // The key-value operations, for either protocol. A write that creates a
  // key wakes the waits on it, as a client's set does.
  enum class Write { kOk, kFull, kTooLarge, kNotInteger, kOverflow };
  // The value at `key`, or null.
  const wire::Bytes* find(const std::string& key) const;
  Write set(const std::string& key, wire::Bytes value);
  // Appends `n` bytes at `p` to the value at `key` (created when absent) in
  // place: the value grows geometrically, so a key appended to N times costs
  // O(total) copying, not O(N x size). kTooLarge past `max_value` bytes.
  Write append(const std::string& key, const uint8_t* p, size_t n, size_t max_value);
  // Adds `delta` to the decimal integer at `key` (0 when absent) into `sum`.
  Write add(const std::string& key, int64_t delta, int64_t& sum);
  // False when there was no such key.
  bool remove(const std::string& key);
  // Charges `n` bytes kept beside the keys (the TCPStore's queues) to the
  // budget: false, and nothing charged, when it would overflow. refund()
  // gives them back.
  bool charge(size_t n);
  void refund(size_t n) { bytes_ -= n; }
  // Removes every key and every charge; registered waits stay, their keys
  // missing again.
  void clear();
  template <class F>
  void for_each_key(F&& f) const {
    for (const auto& entry : data_) f(entry.first);
  }

  // Carries out a closed connection's kOnClose writes (wire.h, "on close").
  void run_on_close(const wire::Request& on_close);
  // Unregisters a waiter (no-op when not registered).
  void cancel(Waiter& waiter);

  size_t num_keys() const { return data_.size(); }
  size_t num_waiters() const { return num_waiters_; }
  size_t bytes() const { return bytes_; }
  size_t max_bytes() const { return max_bytes_; }
  // Estimated heap the registered waits hold (their keys and index entries;
  // the waiters themselves are their connections' to count).
  size_t waiting_bytes() const { return waiting_bytes_; }
  // `waiter`'s share of waiting_bytes(): its wait's bytes over the number
  // of waiters sharing it (0 when not registered).
  size_t share(const Waiter& waiter) const;
  // What one entry costs the heap: its key and value plus the map's node,
  // bucket and allocator overhead. The byte budget is charged with this, so
  // a flood of tiny keys fills it no faster than it fills memory.
  static size_t entry_bytes(size_t key_size, size_t value_size);

 private:
  // A wait's identity: its op and its keys, in order, as entries of index_.
  struct Question {
    wire::Op op = wire::Op::kWait;
    std::vector<const std::string*> keys;
    bool operator==(const Question& o) const { return op == o.op && keys == o.keys; }
  };
  struct QuestionHash {
    size_t operator()(const Question& q) const;
  };
  using Index = std::unordered_map<std::string, std::list<Wait*>>;

  bool all_present(const std::vector<std::string>& keys) const;
  // Encodes the answer of a blocking request whose keys all exist (keys
  // as strings, or as pointers to them).
  template <class Key>
  void answer(wire::Op op, const std::vector<Key>& keys, wire::Bytes& out) const;
  // Adds `waiter` to the wait asking `op` on `keys`, creating it if needed.
  void join(Waiter& waiter, wire::Op op, std::vector<std::string> keys);
  // Removes `wait` from the index and frees it.
  void destroy(Wait* wait);
  // execute()'s writes, each answered into `out`.
  void execute_append(wire::Request& q, wire::Bytes& out);
  void execute_add(wire::Request& q, wire::Bytes& out);
  void execute_multi_set(wire::Request& q, wire::Bytes& out);
  void execute_compare_set(wire::Request& q, wire::Bytes& out);
  // The reply to a write the budget refused.
  std::string full() const;
  // Stores `value`, charging the byte budget; false when it would overflow.
  // `created` says whether the key is new.
  bool store(const std::string& key, wire::Bytes value, bool& created);
  // A key came into existence / went away: the waits on it learn so.
  void created(const std::string& key);
  void removed(const std::string& key);

  size_t max_bytes_;
  size_t bytes_ = 0;
  std::unordered_map<std::string, wire::Bytes> data_;
  // Every key a registered wait asks for, present or not, to those waits.
  // Its nodes do not move, so a Question can point at their keys.
  Index index_;
  // Registered waits by question.
  std::unordered_map<Question, std::unique_ptr<Wait>, QuestionHash> waits_;
  size_t num_waiters_ = 0;
  size_t waiting_bytes_ = 0;
};

// Appends a one-field error / timeout / ok frame.
void write_error(wire::Bytes& out, const std::string& message);

}  // namespace ddprun::rendezvous
