#include "rendezvous/table.h"

#include <algorithm>
#include <charconv>
#include <type_traits>
#include <unordered_set>

#include "rendezvous/store.h"

namespace ddprun::rendezvous {

using wire::Bytes;
using wire::Op;
using wire::Status;
using wire::Writer;

void write_error(Bytes& out, const std::string& message) {
  Writer w(out);
  w.u8(static_cast<uint8_t>(Status::kError));
  w.str(message);
}

namespace {

void write_ok(Bytes& out) {
  Writer w(out);
  w.u8(static_cast<uint8_t>(Status::kOk));
}

void write_i64(Bytes& out, int64_t v) {
  Writer w(out);
  w.u8(static_cast<uint8_t>(Status::kOk));
  w.u64(static_cast<uint64_t>(v));
}

void write_bool(Bytes& out, bool v) {
  Writer w(out);
  w.u8(static_cast<uint8_t>(Status::kOk));
  w.u8(v ? 1 : 0);
}

void write_value(Bytes& out, const Bytes& v) {
  Writer w(out);
  w.u8(static_cast<uint8_t>(Status::kOk));
  w.str(v);
}

// glibc malloc: a chunk is the request plus an 8-byte header, rounded up to
// 16 bytes, and never under 32.
size_t heap_chunk(size_t n) { return n == 0 ? 0 : std::max<size_t>(32, (n + 8 + 15) / 16 * 16); }
// A std::string's own heap beyond its inline buffer (15 bytes).
size_t string_heap(size_t n) { return n > 15 ? heap_chunk(n + 1) : 0; }

}  // namespace

// One question asked by one or more blocked waiters.
struct Table::Wait {
  Question question;  // its key in waits_
  size_t missing = 0;  // distinct keys absent now
  size_t bytes = 0;    // counted in waiting_bytes_
  // Its place in index_, one per distinct key.
  struct Registration {
    Index::value_type* entry;
    std::list<Wait*>::iterator at;
  };
  std::vector<Registration> registered;
  std::list<Waiter*> members;
};

size_t Table::QuestionHash::operator()(const Question& q) const {
  size_t h = static_cast<size_t>(q.op);
  for (const std::string* k : q.keys) h = h * 1000003 ^ std::hash<const void*>()(k);
  return h;
}

Table::Table(size_t max_bytes) : max_bytes_(max_bytes) {}

Table::~Table() {
  while (!waits_.empty()) {
    Wait* w = waits_.begin()->second.get();
    for (Waiter* m : w->members) m->wait = nullptr;
    destroy(w);
  }
}

bool Table::all_present(const std::vector<std::string>& keys) const {
  for (const auto& k : keys) {
    if (data_.find(k) == data_.end()) return false;
  }
  return true;
}

size_t Table::share(const Waiter& waiter) const {
  if (waiter.wait == nullptr) return 0;
  return waiter.wait->bytes / waiter.wait->members.size();
}

size_t Table::entry_bytes(size_t key_size, size_t value_size) {
  // One unordered_map node (next pointer, std::string, std::vector, cached
  // hash: 72 bytes, an 80-byte chunk), a bucket slot (8 bytes, two at the
  // map's worst load), the key's own chunk when it is too long for the
  // string's inline buffer (15 bytes), and the value's chunk.
  constexpr size_t kNode = 80, kBuckets = 16;
  return kNode + kBuckets + string_heap(key_size) + heap_chunk(value_size);
}

bool Table::store(const std::string& key, Bytes value, bool& created) {
  auto it = data_.find(key);
  created = it == data_.end();
  size_t old = created ? 0 : entry_bytes(key.size(), it->second.capacity());
  size_t now = entry_bytes(key.size(), value.capacity());
  if (bytes_ - old + now > max_bytes_) return false;
  bytes_ = bytes_ - old + now;
  if (created) {
    data_.emplace(key, std::move(value));
  } else {
    it->second = std::move(value);
  }
  return true;
}

void Table::join(Waiter& waiter, Op op, std::vector<std::string> keys) {
  // Each key is interned in the index (moved there, not copied), so a
  // question is its op and the index entries of its keys, and asking it
  // again costs no key copies at all.
  Question q;
  q.op = op;
  q.keys.reserve(keys.size());
  std::vector<Index::value_type*> fresh;  // distinct keys, first occurrence
  std::unordered_set<const std::string*> seen;
  seen.reserve(keys.size());
  for (auto& k : keys) {
    auto [it, inserted] = index_.try_emplace(std::move(k));
    q.keys.push_back(&it->first);
    if (seen.insert(&it->first).second) fresh.push_back(&*it);
  }
  auto found = waits_.find(q);
  if (found == waits_.end()) {
    auto w = std::make_unique<Wait>();
    // Every distinct key is indexed, present or not, so a delete counts
    // as much as a write and no wake-up has to recheck the list.
    size_t bytes = heap_chunk(sizeof(Wait)) + 2 * heap_chunk(8 * q.keys.size()) + 64 + 16;
    for (Index::value_type* e : fresh) {
      w->registered.push_back({e, e->second.insert(e->second.end(), w.get())});
      if (!data_.count(e->first)) ++w->missing;
      // Its registration, its list node and (as if no other wait shared
      // it) its index entry: node, bucket, key.
      bytes += sizeof(Wait::Registration) + 32 + 80 + 16 + string_heap(e->first.size());
    }
    w->bytes = bytes;
    w->question = q;
    waiting_bytes_ += bytes;
    found = waits_.emplace(std::move(q), std::move(w)).first;
  } else {
    // Interned keys no registered wait holds cannot occur here: an equal
    // question holds every one of them.
  }
  Wait* w = found->second.get();
  waiter.wait = w;
  waiter.member = w->members.insert(w->members.end(), &waiter);
  ++num_waiters_;
}

void Table::destroy(Wait* w) {
  for (const auto& r : w->registered) {
    r.entry->second.erase(r.at);
    if (r.entry->second.empty()) index_.erase(index_.find(r.entry->first));
  }
  waiting_bytes_ -= w->bytes;
  num_waiters_ -= w->members.size();
  waits_.erase(waits_.find(w->question));
}

void Table::cancel(Waiter& waiter) {
  Wait* w = waiter.wait;
  if (w == nullptr) return;
  waiter.wait = nullptr;
  w->members.erase(waiter.member);
  --num_waiters_;
  if (w->members.empty()) destroy(w);
}

void Table::removed(const std::string& key) {
  auto found = index_.find(key);
  if (found == index_.end()) return;
  for (Wait* w : found->second) ++w->missing;
}

void Table::created(const std::string& key) {
  auto found = index_.find(key);
  if (found == index_.end()) return;
  std::vector<Wait*> ready;
  for (Wait* w : found->second) {
    if (--w->missing == 0) ready.push_back(w);
  }
  if (ready.empty()) return;
  // Answer each question once, unregister it, and only then call back:
  // the callbacks may use the table.
  std::vector<std::pair<Answer, std::vector<Waiter*>>> calls;
  for (Wait* w : ready) {
    auto frame = std::make_shared<Bytes>();
    answer(w->question.op, w->question.keys, *frame);
    std::vector<Waiter*> members(w->members.begin(), w->members.end());
    for (Waiter* m : members) m->wait = nullptr;
    destroy(w);
    calls.emplace_back(std::move(frame), std::move(members));
  }
  for (auto& [frame, members] : calls) {
    for (Waiter* m : members) m->on_ready(frame);
  }
}

template <class Key>
void Table::answer(Op op, const std::vector<Key>& keys, Bytes& out) const {
  auto value = [this](const Key& k) -> const Bytes& {
    if constexpr (std::is_pointer_v<Key>) {
      return data_.at(*k);
    } else {
      return data_.at(k);
    }
  };
  switch (op) {
    case Op::kGet:
      write_value(out, value(keys[0]));
      return;
    case Op::kMultiGet: {
      size_t total = 0;
      for (const auto& k : keys) total += 4 + value(k).size();
      if (total + 16 > wire::kMaxFrameSize) {
        write_error(out, "multi_get: answer of " + std::to_string(total) +
                             " bytes exceeds the frame limit");
        return;
      }
      Writer w(out);
      w.u8(static_cast<uint8_t>(Status::kOk));
      w.u32(static_cast<uint32_t>(keys.size()));
      for (const auto& k : keys) w.str(value(k));
      return;
    }
    default:
      write_ok(out);
  }
}

const Bytes* Table::find(const std::string& key) const {
  auto it = data_.find(key);
  return it == data_.end() ? nullptr : &it->second;
}

Table::Write Table::set(const std::string& key, Bytes value) {
  bool fresh = false;
  if (!store(key, std::move(value), fresh)) return Write::kFull;
  if (fresh) created(key);
  return Write::kOk;
}

Table::Write Table::append(const std::string& key, const uint8_t* p, size_t n, size_t max_value) {
  auto it = data_.find(key);
  if (it == data_.end()) return n > max_value ? Write::kTooLarge : set(key, Bytes(p, p + n));
  Bytes& v = it->second;
  if (n > max_value || v.size() > max_value - n) return Write::kTooLarge;
  if (v.size() + n > v.capacity()) {
    // Grown here, not by insert(), so the budget is charged with the
    // capacity the value will hold before it holds it.
    const size_t grown = std::max(v.size() + n, 2 * v.capacity());
    const size_t old = entry_bytes(key.size(), v.capacity());
    const size_t now = entry_bytes(key.size(), grown);
    if (bytes_ - old + now > max_bytes_) return Write::kFull;
    v.reserve(grown);
    bytes_ = bytes_ - old + entry_bytes(key.size(), v.capacity());
  }
  v.insert(v.end(), p, p + n);
  return Write::kOk;
}

Table::Write Table::add(const std::string& key, int64_t delta, int64_t& sum) {
  int64_t current = 0;
  if (const Bytes* v = find(key)) {
    const char* b = reinterpret_cast<const char*>(v->data());
    const char* e = b + v->size();
    auto [p, ec] = std::from_chars(b, e, current);
    if (ec != std::errc() || p != e) return Write::kNotInteger;
  }
  if (__builtin_add_overflow(current, delta, &sum)) return Write::kOverflow;
  const std::string text = std::to_string(sum);
  return set(key, Bytes(text.begin(), text.end()));
}

bool Table::remove(const std::string& key) {
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  bytes_ -= entry_bytes(it->first.size(), it->second.capacity());
  data_.erase(it);
  removed(key);
  return true;
}

bool Table::charge(size_t n) {
  if (n > max_bytes_ - bytes_) return false;
  bytes_ += n;
  return true;
}

void Table::clear() {
  for (const auto& entry : data_) removed(entry.first);
  data_.clear();
  bytes_ = 0;
}

std::string Table::full() const {
  // Built only when a write is refused: on every request it cost the
  // server three allocations and a to_string.
  return "store full: the server holds at most " + std::to_string(max_bytes_) +
         " bytes of keys and values";
}

void Table::execute_append(wire::Request& q, Bytes& out) {
  const Bytes& tail = q.values[0];
  switch (append(q.keys[0], tail.data(), tail.size(), wire::kMaxValueSize)) {
    case Write::kOk:
      return write_ok(out);
    case Write::kTooLarge:
      return write_error(out, "append: value at " + quoted_key(q.keys[0]) + " would exceed " +
                                  std::to_string(wire::kMaxValueSize) + " bytes");
    default:
      return write_error(out, full());
  }
}

void Table::execute_add(wire::Request& q, Bytes& out) {
  int64_t sum = 0;
  switch (add(q.keys[0], q.delta, sum)) {
    case Write::kOk:
      return write_i64(out, sum);
    case Write::kNotInteger:
      return write_error(out, "add: value at " + quoted_key(q.keys[0]) + " is not an integer");
    case Write::kOverflow:
      return write_error(out, "add: integer overflow at " + quoted_key(q.keys[0]));
    default:
      return write_error(out, full());
  }
}

void Table::execute_multi_set(wire::Request& q, Bytes& out) {
  // Every value stored before any wait hears of it: a multi-get of these
  // keys is answered with all of them.
  std::vector<const std::string*> fresh_keys;
  bool ok = true, fresh = false;
  for (size_t i = 0; i < q.keys.size() && ok; ++i) {
    ok = store(q.keys[i], std::move(q.values[i]), fresh);
    if (ok && fresh) fresh_keys.push_back(&q.keys[i]);
  }
  if (ok) {
    write_ok(out);
  } else {
    write_error(out, full());
  }
  for (const std::string* k : fresh_keys) created(*k);
}

void Table::execute_compare_set(wire::Request& q, Bytes& out) {
  const Bytes* now = find(q.keys[0]);
  const Bytes& expected = q.values[0];
  const Bytes& desired = q.values[1];
  if ((now == nullptr && expected.empty()) || (now != nullptr && *now == expected)) {
    if (set(q.keys[0], desired) != Write::kOk) return write_error(out, full());
    return write_value(out, desired);
  }
  write_value(out, now == nullptr ? Bytes{} : *now);
}

bool Table::execute(wire::Request& q, Bytes& out, Waiter& waiter) {
  switch (q.op) {
    case Op::kSet:
      // Moved: the caller drops the request once it is answered.
      if (set(q.keys[0], std::move(q.values[0])) == Write::kOk) {
        write_ok(out);
      } else {
        write_error(out, full());
      }
      return true;
    case Op::kMultiSet:
      execute_multi_set(q, out);
      return true;
    case Op::kAppend:
      execute_append(q, out);
      return true;
    case Op::kAdd:
      execute_add(q, out);
      return true;
    case Op::kCompareSet:
      execute_compare_set(q, out);
      return true;
    case Op::kCheck:
      write_bool(out, all_present(q.keys));
      return true;
    case Op::kDelete:
      write_bool(out, remove(q.keys[0]));
      return true;
    case Op::kNumKeys:
      write_i64(out, static_cast<int64_t>(data_.size()));
      return true;
    case Op::kPing:
      write_ok(out);
      return true;
    case Op::kGet:
    case Op::kWait:
    case Op::kMultiGet:
      if (all_present(q.keys)) {
        answer(q.op, q.keys, out);
        return true;
      }
      if (q.timeout_ms == 0) {
        Writer w(out);
        w.u8(static_cast<uint8_t>(Status::kTimeout));
        return true;
      }
      join(waiter, q.op, std::move(q.keys));
      q.keys.clear();
      return false;
    case Op::kAuth:
      write_error(out, "auth: already authenticated or not required");
      return true;
    case Op::kOnClose:
      // Per connection: the server keeps it (Conn::on_close).
      write_error(out, "on_close: not a table operation");
      return true;
  }
  write_error(out, "unknown opcode");
  return true;
}

void Table::run_on_close(const wire::Request& q) {
  if (q.keys.empty()) return;
  // Through execute() so the writes wake waiters exactly as a client's
  // would; the replies go nowhere.
  Bytes discard;
  Waiter unused;
  wire::Request w;
  w.op = Op::kMultiSet;
  if (data_.count(q.keys[0])) {
    // The record the notice would write is there already (the round ended
    // before this member died): only its death mark, so the next round
    // does not wait for a member that will not come (store.h).
    if (q.keys.size() < 2 || q.values.size() < 2) return;
    w.keys = {q.keys[1]};
    w.values = {q.values[1]};
    execute(w, discard, unused);
    return;
  }
  w.keys = q.keys;
  w.values = q.values;
  execute(w, discard, unused);
  if (q.counter.empty()) return;
  w.op = Op::kAdd;
  w.keys = {q.counter};
  w.values.clear();
  w.delta = 1;
  execute(w, discard, unused);
}

}  // namespace ddprun::rendezvous
