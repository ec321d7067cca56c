#include "rendezvous/tcpstore_executor.h"

#include <algorithm>
#include <cstdint>
#include <limits>

namespace ddprun::rendezvous::tcpstore {

namespace {
// What a queued value costs the budget: its bytes and its slot, priced as
// a key of the table is (Table::entry_bytes).
size_t queued_bytes(const std::string& key, const Bytes& value) {
  return Table::entry_bytes(key.size(), value.size());
}
}  // namespace

Executor::Executor(size_t max_store_bytes) : table_(max_store_bytes) {}

bool Executor::present(const std::string& key) const {
  if (table_.find(key) != nullptr) return true;
  auto it = queues_.find(key);
  return it != queues_.end() && !it->second.empty();
}

bool Executor::written(Table::Write result, const std::string& key, std::string& refusal) {
  if (result == Table::Write::kOk) {
    wake(key);
    return true;
  }
  refusal = "the store is full (" + std::to_string(table_.max_bytes()) + " bytes)";
  return false;
}

bool Executor::execute(Request& q, Bytes& out, Waiter& waiter, std::string& refusal) {
  const std::string* key = q.keys.empty() ? nullptr : &q.keys[0];
  switch (q.op) {
    case Op::kValidate:
      if (q.u32 == kValidateMagic) return true;
      refusal = "VALIDATE with magic " + std::to_string(q.u32) + ", not torch's";
      return false;
    case Op::kPing:
      put_u32(out, q.u32);
      return true;
    case Op::kSet:
      return written(table_.set(*key, std::move(q.values[0])), *key, refusal);
    case Op::kCompareSet:
      return compare_set(q, out, refusal);
    case Op::kGet: {
      const Bytes* v = table_.find(*key);
      put_string(out, v == nullptr ? Bytes{} : *v);
      return true;
    }
    case Op::kAdd:
      return add(q, out, refusal);
    case Op::kCheck: {
      bool all = true;
      for (const auto& k : q.keys) all = all && present(k);
      put_u8(out, all ? kReady : kNotReady);
      return true;
    }
    case Op::kWait:
      return wait(q, out, waiter);
    case Op::kGetNumKeys:
      put_i64(out, static_cast<int64_t>(table_.num_keys()));
      return true;
    case Op::kDeleteKey:
      put_i64(out, table_.remove(*key) ? 1 : 0);
      return true;
    case Op::kAppend: {
      const Bytes& tail = q.values[0];
      // No bound but the table's: torch's server has none either.
      const size_t unbounded = std::numeric_limits<size_t>::max();
      return written(table_.append(*key, tail.data(), tail.size(), unbounded), *key, refusal);
    }
    case Op::kMultiGet:
      for (const auto& k : q.keys) {
        const Bytes* v = table_.find(k);
        put_string(out, v == nullptr ? Bytes{} : *v);
      }
      return true;
    case Op::kMultiSet:
      for (size_t i = 0; i < q.keys.size(); ++i)
        if (!written(table_.set(q.keys[i], std::move(q.values[i])), q.keys[i], refusal))
          return false;
      return true;
    case Op::kCancelWait:
      cancel(waiter);
      put_u8(out, kWaitCanceled);
      return true;
    case Op::kQueuePush:
      return queue_push(q, refusal);
    case Op::kQueuePop:
      queue_pop(q, out);
      return true;
    case Op::kQueueLen: {
      auto it = queues_.find(*key);
      put_i64(out, it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size()));
      return true;
    }
    case Op::kListKeys:
      put_i64(out, static_cast<int64_t>(table_.num_keys()));
      table_.for_each_key([&out](const std::string& k) { put_string(out, k); });
      return true;
    case Op::kBarrier:
      return barrier(q, waiter, refusal);
    case Op::kWatchKey:
      refusal = "WATCH_KEY (torch 1.13's watch_key callbacks) is not supported by this store";
      return false;
  }
  return true;
}

bool Executor::compare_set(Request& q, Bytes& out, std::string& refusal) {
  const std::string& key = q.keys[0];
  const Bytes* now = table_.find(key);
  const Bytes& expected = q.values[0];
  if (now == nullptr && !expected.empty()) {
    // torch answers the expected value when the key is absent.
    put_string(out, expected);
    wake(key);
    return true;
  }
  if (now == nullptr || *now == expected) {
    if (!written(table_.set(key, q.values[1]), key, refusal)) return false;
    now = table_.find(key);
  }
  put_string(out, *now);
  return true;
}

bool Executor::add(Request& q, Bytes& out, std::string& refusal) {
  const std::string& key = q.keys[0];
  int64_t sum = 0;
  switch (const Table::Write result = table_.add(key, q.number, sum)) {
    case Table::Write::kNotInteger:
      refusal = "ADD on '" + key + "', whose value is not an integer";
      return false;
    case Table::Write::kOverflow:
      refusal = "ADD overflows the integer at '" + key + "'";
      return false;
    default:
      if (!written(result, key, refusal)) return false;
  }
  put_i64(out, sum);
  return true;
}

bool Executor::wait(Request& q, Bytes& out, Waiter& waiter) {
  cancel(waiter);  // torch's client never overlaps waits; a new one replaces
  size_t missing = 0;
  for (const auto& k : q.keys) missing += present(k) ? 0 : 1;
  if (missing == 0) {
    put_u8(out, kStopWaiting);
    return true;
  }
  for (const auto& k : q.keys)
    if (!present(k)) await(waiter, k);
  waiter.awaited = missing;
  ++num_waiters_;
  return true;
}

bool Executor::barrier(Request& q, Waiter& waiter, std::string& refusal) {
  // As torch's libuv server: count arrivals in the key, answer every
  // arrival once `world` have come. Registered before the count is stored,
  // so that the arrival that completes the barrier is answered with the
  // others by its own write.
  const std::string& key = q.keys[0];
  cancel(waiter);
  await(waiter, key);
  waiter.awaited = 1;
  ++num_waiters_;
  int64_t count = 0;
  const Table::Write result = table_.add(key, 1, count);
  if (result == Table::Write::kNotInteger || result == Table::Write::kOverflow) {
    refusal = "BARRIER on '" + key + "', whose value is not a count";
    return false;
  }
  if (result != Table::Write::kOk) return written(result, key, refusal);
  if (count >= q.number) wake(key);
  return true;
}

bool Executor::queue_push(Request& q, std::string& refusal) {
  const std::string& key = q.keys[0];
  if (!table_.charge(queued_bytes(key, q.values[0])))
    return written(Table::Write::kFull, key, refusal);
  queues_[key].push_back(std::move(q.values[0]));
  wake_one(key);
  return true;
}

void Executor::queue_pop(Request& q, Bytes& out) {
  const std::string& key = q.keys[0];
  auto it = queues_.find(key);
  if (it == queues_.end()) {
    put_i64(out, 0);
    return;
  }
  auto& queue = it->second;
  put_i64(out, static_cast<int64_t>(queue.size()));
  put_string(out, queue.front());
  table_.refund(queued_bytes(key, queue.front()));
  queue.pop_front();
  if (queue.empty()) queues_.erase(it);
}

void Executor::await(Waiter& waiter, const std::string& key) {
  waiting_[key].push_back(&waiter);
  waiter.keys.push_back(key);
}

void Executor::cancel(Waiter& waiter) {
  if (waiter.awaited == 0) {
    waiter.keys.clear();
    return;
  }
  for (const auto& k : waiter.keys) {
    auto it = waiting_.find(k);
    if (it == waiting_.end()) continue;
    auto& list = it->second;
    list.erase(std::remove(list.begin(), list.end(), &waiter), list.end());
    if (list.empty()) waiting_.erase(it);
  }
  waiter.keys.clear();
  waiter.awaited = 0;
  --num_waiters_;
}

void Executor::finish(Waiter& waiter) {
  // Every registration of a finished waiter was consumed on its way to 0.
  waiter.keys.clear();
  waiter.awaited = 0;
  --num_waiters_;
  static const Bytes kReply{kStopWaiting};
  waiter.on_ready(kReply);
}

void Executor::wake(const std::string& key) {
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return;
  auto list = std::move(it->second);
  waiting_.erase(it);
  std::vector<Waiter*> ready;
  for (Waiter* w : list)
    if (w->awaited > 0 && --w->awaited == 0) ready.push_back(w);
  for (Waiter* w : ready) finish(*w);
}

void Executor::wake_one(const std::string& key) {
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return;
  auto& list = it->second;
  Waiter* ready = nullptr;
  while (!list.empty() && ready == nullptr) {
    Waiter* w = list.front();
    list.erase(list.begin());
    if (w->awaited > 0 && --w->awaited == 0) ready = w;
  }
  if (list.empty()) waiting_.erase(it);
  if (ready != nullptr) finish(*ready);
}

void Executor::clear() {
  table_.clear();
  queues_.clear();
}

}  // namespace ddprun::rendezvous::tcpstore
