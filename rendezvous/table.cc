#include "rendezvous/table.h"

#include <algorithm>
#include <charconv>
#include <unordered_set>

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

std::string quoted(const std::string& key) {
  return "'" + key.substr(0, 128) + (key.size() > 128 ? "...'" : "'");
}

}  // namespace

size_t Table::num_waiters() const {
  std::unordered_set<const Waiter*> distinct;
  for (const auto& [key, list] : waiters_) distinct.insert(list.begin(), list.end());
  return distinct.size();
}

bool Table::all_present(const std::vector<std::string>& keys) const {
  for (const auto& k : keys) {
    if (data_.find(k) == data_.end()) return false;
  }
  return true;
}

namespace {
// glibc malloc: a chunk is the request plus an 8-byte header, rounded up to
// 16 bytes, and never under 32.
size_t heap_chunk(size_t n) { return n == 0 ? 0 : std::max<size_t>(32, (n + 8 + 15) / 16 * 16); }
}  // namespace

size_t Table::entry_bytes(size_t key_size, size_t value_size) {
  // One unordered_map node (next pointer, std::string, std::vector, cached
  // hash: 72 bytes, an 80-byte chunk), a bucket slot (8 bytes, two at the
  // map's worst load), the key's own chunk when it is too long for the
  // string's inline buffer (15 bytes), and the value's chunk.
  constexpr size_t kNode = 80, kBuckets = 16, kInlineKey = 15;
  return kNode + kBuckets + (key_size > kInlineKey ? heap_chunk(key_size + 1) : 0) +
         heap_chunk(value_size);
}

bool Table::store(const std::string& key, Bytes value) {
  auto it = data_.find(key);
  size_t old = it == data_.end() ? 0 : entry_bytes(key.size(), it->second.capacity());
  size_t now = entry_bytes(key.size(), value.capacity());
  if (bytes_ - old + now > max_bytes_) return false;
  bytes_ = bytes_ - old + now;
  if (it == data_.end()) {
    data_.emplace(key, std::move(value));
  } else {
    it->second = std::move(value);
  }
  return true;
}

void Table::register_missing(Waiter& waiter) {
  for (const auto& k : waiter.request->keys) {
    if (data_.count(k)) continue;
    auto& list = waiters_[k];
    waiter.registered.emplace_back(k, list.insert(list.end(), &waiter));
  }
}

void Table::cancel(Waiter& waiter) {
  for (auto& [key, it] : waiter.registered) {
    auto found = waiters_.find(key);
    if (found == waiters_.end()) continue;
    found->second.erase(it);
    if (found->second.empty()) waiters_.erase(found);
  }
  waiter.registered.clear();
}

void Table::notify(const std::string& key) {
  auto found = waiters_.find(key);
  if (found == waiters_.end()) return;
  std::list<Waiter*> woken = std::move(found->second);
  waiters_.erase(found);
  std::vector<Waiter*> ready;
  for (Waiter* w : woken) {
    // Drop the registration for `key` (its list is gone), then re-check the
    // rest: a key seen earlier may have been deleted since.
    std::vector<std::pair<std::string, std::list<Waiter*>::iterator>> others;
    for (auto& r : w->registered) {
      if (r.first != key) others.push_back(std::move(r));
    }
    w->registered = std::move(others);
    cancel(*w);
    if (all_present(w->request->keys)) {
      ready.push_back(w);
    } else {
      register_missing(*w);
    }
  }
  // Callbacks run after the table is consistent again.
  for (Waiter* w : ready) w->on_ready();
}

void Table::answer_ready(const wire::Request& q, Bytes& out) const {
  switch (q.op) {
    case Op::kGet:
      write_value(out, data_.at(q.keys[0]));
      return;
    case Op::kMultiGet: {
      size_t total = 0;
      for (const auto& k : q.keys) total += 4 + data_.at(k).size();
      if (total + 16 > wire::kMaxFrameSize) {
        write_error(out, "multi_get: answer of " + std::to_string(total) +
                             " bytes exceeds the frame limit");
        return;
      }
      Writer w(out);
      w.u8(static_cast<uint8_t>(Status::kOk));
      w.u32(static_cast<uint32_t>(q.keys.size()));
      for (const auto& k : q.keys) w.str(data_.at(k));
      return;
    }
    default:
      write_ok(out);
  }
}

bool Table::execute(const wire::Request& q, Bytes& out, Waiter& waiter) {
  const std::string full = "store full: the server holds at most " +
                           std::to_string(max_bytes_) + " bytes of keys and values";
  switch (q.op) {
    case Op::kSet:
      if (!store(q.keys[0], q.values[0])) return write_error(out, full), true;
      write_ok(out);
      notify(q.keys[0]);
      return true;
    case Op::kMultiSet:
      for (size_t i = 0; i < q.keys.size(); ++i) {
        if (!store(q.keys[i], q.values[i])) {
          write_error(out, full);
          for (size_t j = 0; j < i; ++j) notify(q.keys[j]);
          return true;
        }
      }
      write_ok(out);
      for (const auto& k : q.keys) notify(k);
      return true;
    case Op::kAppend: {
      auto it = data_.find(q.keys[0]);
      Bytes v = it == data_.end() ? Bytes{} : it->second;
      if (v.size() + q.values[0].size() > wire::kMaxValueSize) {
        write_error(out, "append: value at " + quoted(q.keys[0]) + " would exceed " +
                             std::to_string(wire::kMaxValueSize) + " bytes");
        return true;
      }
      v.insert(v.end(), q.values[0].begin(), q.values[0].end());
      if (!store(q.keys[0], std::move(v))) return write_error(out, full), true;
      write_ok(out);
      notify(q.keys[0]);
      return true;
    }
    case Op::kAdd: {
      int64_t current = 0;
      auto it = data_.find(q.keys[0]);
      if (it != data_.end()) {
        const char* b = reinterpret_cast<const char*>(it->second.data());
        const char* e = b + it->second.size();
        auto [p, ec] = std::from_chars(b, e, current);
        if (ec != std::errc() || p != e) {
          write_error(out, "add: value at " + quoted(q.keys[0]) + " is not an integer");
          return true;
        }
      }
      int64_t next;
      if (__builtin_add_overflow(current, q.delta, &next)) {
        write_error(out, "add: integer overflow at " + quoted(q.keys[0]));
        return true;
      }
      std::string text = std::to_string(next);
      if (!store(q.keys[0], Bytes(text.begin(), text.end()))) return write_error(out, full), true;
      write_i64(out, next);
      notify(q.keys[0]);
      return true;
    }
    case Op::kCompareSet: {
      auto it = data_.find(q.keys[0]);
      const Bytes& expected = q.values[0];
      const Bytes& desired = q.values[1];
      if ((it == data_.end() && expected.empty()) || (it != data_.end() && it->second == expected)) {
        if (!store(q.keys[0], desired)) return write_error(out, full), true;
        write_value(out, desired);
        notify(q.keys[0]);
      } else {
        write_value(out, it == data_.end() ? Bytes{} : it->second);
      }
      return true;
    }
    case Op::kCheck:
      write_bool(out, all_present(q.keys));
      return true;
    case Op::kDelete: {
      auto it = data_.find(q.keys[0]);
      bool existed = it != data_.end();
      if (existed) {
        bytes_ -= entry_bytes(it->first.size(), it->second.capacity());
        data_.erase(it);
      }
      write_bool(out, existed);
      return true;
    }
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
        answer_ready(q, out);
        return true;
      }
      if (q.timeout_ms == 0) {
        Writer w(out);
        w.u8(static_cast<uint8_t>(Status::kTimeout));
        return true;
      }
      waiter.request = &q;
      register_missing(waiter);
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
  if (q.keys.empty() || data_.count(q.keys[0])) return;
  // Through execute() so the writes wake waiters exactly as a client's
  // would; the replies go nowhere.
  Bytes discard;
  Waiter unused;
  wire::Request w;
  w.op = Op::kMultiSet;
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
