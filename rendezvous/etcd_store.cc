#include "rendezvous/etcd_store.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <thread>

namespace ddprun::rendezvous {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string b64(const std::string& in) {
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t n = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int s : {18, 12, 6, 0}) out += kB64[(n >> s) & 63];
  }
  if (i + 1 == in.size()) {
    uint32_t n = uint8_t(in[i]) << 16;
    out += kB64[(n >> 18) & 63];
    out += kB64[(n >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    uint32_t n = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    for (int s : {18, 12, 6}) out += kB64[(n >> s) & 63];
    out += "=";
  }
  return out;
}
std::string b64(const Bytes& in) { return b64(to_string(in)); }

Bytes unb64(const std::string& in) {
  Bytes out;
  uint32_t n = 0;
  int bits = 0;
  for (char c : in) {
    const char* p = c ? std::strchr(kB64, c) : nullptr;
    if (!p) continue;  // '=' padding (and nothing else is sent by etcd)
    n = (n << 6) | uint32_t(p - kB64);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(uint8_t((n >> bits) & 0xff));
    }
  }
  return out;
}

// The gateway writes int64 as strings and leaves out zero/false fields.
int64_t num(const json& j, const char* field) {
  if (!j.contains(field)) return 0;
  const json& v = j.at(field);
  return v.is_string() ? std::stoll(v.get<std::string>()) : v.get<int64_t>();
}


// The end of the key range holding every key that starts with `prefix`.
std::string prefix_end(std::string prefix) {
  while (!prefix.empty() && uint8_t(prefix.back()) == 0xff) prefix.pop_back();
  if (prefix.empty()) return std::string(1, '\0');  // to the end of the key space
  prefix.back() = char(uint8_t(prefix.back()) + 1);
  return prefix;
}

std::string folder(const std::string& key) {
  auto slash = key.rfind('/');
  return slash == std::string::npos ? "" : key.substr(0, slash + 1);
}

json put_op(const std::string& key, const Bytes& value, int64_t lease = 0) {
  json put = {{"key", b64(key)}, {"value", b64(value)}};
  if (lease) put["lease"] = std::to_string(lease);
  return {{"request_put", put}};
}
json delete_op(const std::string& key) { return {{"request_delete_range", {{"key", b64(key)}}}}; }
json compare_mod(const std::string& key, int64_t rev) {
  return {{"result", "EQUAL"}, {"target", "MOD"}, {"key", b64(key)}, {"mod_revision", std::to_string(rev)}};
}
json compare_absent(const std::string& key) {
  return {{"result", "EQUAL"}, {"target", "CREATE"}, {"key", b64(key)}, {"create_revision", "0"}};
}

}  // namespace

struct EtcdStore::Impl {
  explicit Impl(EtcdOptions o) : gateway(std::move(o)) {}
  EtcdGateway gateway;
  Duration lease_ttl{15000};  // the keep-alive window once set
  // The armed death notice: its lease and record key.
  int64_t lease = 0;
  std::string record;
  Clock::time_point next_refresh;

  json post(const std::string& path, const json& body, const std::string& what) {
    refresh_lease();
    return gateway.post(path, body, what);
  }

  // The lease lives while this store is used: KeepAlive calls it far more
  // often than a third of the TTL.
  void refresh_lease() {
    if (!lease || Clock::now() < next_refresh) return;
    next_refresh = Clock::now() + lease_ttl / 3;
    json r = gateway.post("/v3/lease/keepalive", {{"ID", std::to_string(lease)}}, "lease keep-alive");
    if (num(r.value("result", json::object()), "TTL") <= 0)
      spdlog::debug("etcd: lease {:x} has ended; the other nodes apply this node's death notice", lease);
  }

  // A name no other add in this job uses: this store's random id, a count
  // (pids repeat across containers and hosts; 64 random bits do not).
  std::string next_marker() { return std::to_string(id) + "." + std::to_string(++adds); }
  const uint64_t id = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  uint64_t adds = 0;

  // nullopt when absent; else (value, mod_revision).
  std::optional<std::pair<Bytes, int64_t>> range(const std::string& key) {
    json r = post("/v3/kv/range", {{"key", b64(key)}}, "range(" + quoted_key(key) + ")");
    if (!r.contains("kvs") || r["kvs"].empty()) return std::nullopt;
    const json& kv = r["kvs"][0];
    return std::make_pair(unb64(kv.value("value", "")), num(kv, "mod_revision"));
  }

  json txn(const json& compare, const json& success, const json& failure, const std::string& what) {
    return post("/v3/kv/txn", {{"compare", compare}, {"success", success}, {"failure", failure}}, what);
  }

  // Puts `desired` if `key` is absent (absent == true) or holds `expected`
  // (by value, or by mod_revision when rev > 0). Returns (succeeded, value after).
  std::pair<bool, Bytes> cas(const std::string& key, const Bytes& expected, const Bytes& desired,
                             int64_t rev, bool absent) {
    json cmp = absent ? compare_absent(key)
               : rev > 0 ? compare_mod(key, rev)
                         : json{{"result", "EQUAL"}, {"target", "VALUE"}, {"key", b64(key)},
                                {"value", b64(expected)}};
    json r = txn(json::array({cmp}), json::array({put_op(key, desired)}),
                 json::array({{{"request_range", {{"key", b64(key)}}}}}),
                 "compare_set(" + quoted_key(key) + ")");
    if (r.value("succeeded", false)) return {true, desired};
    Bytes now;
    if (r.contains("responses") && !r["responses"].empty()) {
      const json& rr = r["responses"][0].value("response_range", json::object());
      if (rr.contains("kvs") && !rr["kvs"].empty()) now = unb64(rr["kvs"][0].value("value", ""));
    }
    return {false, now};
  }

  void disarm() {
    if (!lease) return;
    const int64_t id = lease;
    lease = 0;
    txn(json::array(), json::array({delete_op(record), delete_op(record + "/alive")}), json::array(),
        "set_on_close(cancel)");
    gateway.post("/v3/lease/revoke", {{"ID", std::to_string(id)}}, "lease revoke");
  }

  // Applies one ended session's notice: when its first key is absent, every
  // pair is set and the counter gets 1, with the record deleted in the same
  // transaction (so exactly one participant applies it).
  void apply(const std::string& rec_key, int64_t rec_rev, const std::string& text) {
    json rec = json::parse(text, nullptr, false);
    if (rec.is_discarded() || !rec.contains("keys") || rec["keys"].empty()) {
      txn(json::array({compare_mod(rec_key, rec_rev)}), json::array({delete_op(rec_key)}), json::array(),
          "settle_closed");
      return;
    }
    std::vector<std::string> keys;
    for (const auto& k : rec["keys"]) keys.push_back(to_string(unb64(k.get<std::string>())));
    const std::string counter = to_string(unb64(rec.value("counter", "")));
    for (int attempt = 0; attempt < 16; ++attempt) {
      json compare = json::array({compare_mod(rec_key, rec_rev), compare_absent(keys[0])});
      json ops = json::array({delete_op(rec_key)});
      for (size_t i = 0; i < keys.size() && i < rec["values"].size(); ++i)
        ops.push_back(put_op(keys[i], unb64(rec["values"][i].get<std::string>())));
      if (!counter.empty()) {
        auto cur = range(counter);
        int64_t v = 0;
        try {
          if (cur) v = std::stoll(to_string(cur->first));
        } catch (const std::exception&) {
        }
        compare.push_back(cur ? compare_mod(counter, cur->second) : compare_absent(counter));
        ops.push_back(put_op(counter, to_bytes(std::to_string(v + 1))));
      }
      if (txn(compare, ops, json::array(), "settle_closed(" + quoted_key(rec_key) + ")").value("succeeded", false))
        return;
      // Lost a race: the record is gone (someone applied it), the first key
      // exists (the round already ended: only the death mark, keys[1], is
      // written, and the record dropped; store.h), or the counter moved
      // (try again).
      auto now = range(rec_key);
      if (!now || now->second != rec_rev) return;
      if (range(keys[0])) {
        json mark = json::array({delete_op(rec_key)});
        if (keys.size() > 1 && rec["values"].size() > 1)
          mark.push_back(put_op(keys[1], unb64(rec["values"][1].get<std::string>())));
        txn(json::array({compare_mod(rec_key, rec_rev)}), mark, json::array(), "settle_closed");
        return;
      }
    }
  }
};

EtcdStore::EtcdStore(EtcdOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

EtcdStore::~EtcdStore() {
  if (!impl_->lease) return;
  // Gone without a goodbye: revoking the lease fires the notice now rather
  // than when its TTL runs out.
  try {
    impl_->gateway.post("/v3/lease/revoke", {{"ID", std::to_string(impl_->lease)}}, "lease revoke");
  } catch (const std::exception& e) {
    spdlog::debug("etcd: {} (the lease ends with its TTL)", e.what());
  }
}

void EtcdStore::set(const std::string& key, const Bytes& value) {
  impl_->post("/v3/kv/put", {{"key", b64(key)}, {"value", b64(value)}}, "set(" + quoted_key(key) + ")");
}

void EtcdStore::multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  if (keys.size() != values.size())
    throw StoreError("etcd: multi_set: " + std::to_string(keys.size()) + " keys but " +
                     std::to_string(values.size()) + " values");
  constexpr size_t kMaxTxnOps = 128;
  for (size_t begin = 0; begin < keys.size(); begin += kMaxTxnOps) {
    const size_t end = std::min(keys.size(), begin + kMaxTxnOps);
    json ops = json::array();
    for (size_t i = begin; i < end; ++i) ops.push_back(put_op(keys[i], values[i]));
    impl_->txn(json::array(), ops, json::array(),
               "multi_set(" + quoted_key(keys[begin]) + " and " + std::to_string(end - begin - 1) + " more)");
  }
}

Bytes EtcdStore::get(const std::string& key, Duration timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (auto v = impl_->range(key)) return v->first;
    if (Clock::now() >= deadline)
      throw TimeoutError("etcd: get(" + quoted_key(key) + ") timed out after " +
                         std::to_string(timeout.count()) + " ms");
    std::this_thread::sleep_for(std::min<Duration>(
        impl_->gateway.options().poll_interval,
        std::chrono::duration_cast<Duration>(deadline - Clock::now()) + Duration(1)));
  }
}

int64_t EtcdStore::add(const std::string& key, int64_t delta) {
  for (;;) {  // a lost race is retried: someone else's add went first
    auto cur = impl_->range(key);
    int64_t v = 0;
    if (cur) {
      try {
        v = std::stoll(to_string(cur->first));
      } catch (const std::exception&) {
        throw StoreError("etcd: add: value at " + quoted_key(key) + " is not an integer");
      }
    }
    // A marker key unique to this attempt is put in the same transaction.
    // Why: the gateway sends a request again to the next endpoint when one
    // got it but did not answer (a member that died after committing, a
    // "request timed out" that etcd committed anyway). The repeat then fails
    // its compare against our own write, which looks like a lost race: only
    // the marker tells that this attempt was applied, so it is not added twice.
    const std::string marker = key + "/.add/" + impl_->next_marker();
    Bytes next = to_bytes(std::to_string(v + delta));
    json cmp = cur ? compare_mod(key, cur->second) : compare_absent(key);
    json r = impl_->txn(json::array({cmp}), json::array({put_op(key, next), put_op(marker, {})}),
                        json::array(), "add(" + quoted_key(key) + ")");
    const bool applied = r.value("succeeded", false) || impl_->range(marker);
    if (!applied) continue;
    remove(marker);
    return v + delta;
  }
}

Bytes EtcdStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return impl_->cas(key, expected, desired, 0, expected.empty()).second;
}

void EtcdStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  const auto deadline = Clock::now() + timeout;
  for (const auto& k : keys) {
    auto left = std::chrono::duration_cast<Duration>(deadline - Clock::now());
    get(k, left.count() < 0 ? Duration(0) : left);
  }
}

bool EtcdStore::check(const std::vector<std::string>& keys) {
  for (const auto& k : keys)
    if (!impl_->range(k)) return false;
  return true;
}

bool EtcdStore::remove(const std::string& key) {
  json r = impl_->post("/v3/kv/deleterange", {{"key", b64(key)}}, "remove(" + quoted_key(key) + ")");
  return num(r, "deleted") > 0;
}

int64_t EtcdStore::remove_prefix(const std::string& prefix) {
  json r = impl_->post("/v3/kv/deleterange", {{"key", b64(prefix)}, {"range_end", b64(prefix_end(prefix))}},
                       "remove_prefix(" + quoted_key(prefix) + ")");
  return num(r, "deleted");
}

int64_t EtcdStore::num_keys() {
  // Every key: from "\0" to the end of the key space ("\0" as range_end).
  json r = impl_->post("/v3/kv/range",
                       {{"key", b64(std::string(1, '\0'))}, {"range_end", b64(std::string(1, '\0'))},
                        {"count_only", true}},
                       "num_keys");
  return num(r, "count");
}

void EtcdStore::ping() { impl_->post("/v3/maintenance/status", json::object(), "ping"); }

void EtcdStore::set_reply_window(Duration window) {
  impl_->gateway.set_retry_window(window);
  if (window.count() > 0) impl_->lease_ttl = window;
}

std::string EtcdStore::local_address() const { return impl_->gateway.local_address(); }

bool EtcdStore::set_on_close(const std::vector<std::string>& keys, const std::vector<Bytes>& values,
                             const std::string& counter) {
  auto& im = *impl_;
  im.disarm();
  if (keys.empty()) return true;
  if (keys.size() != values.size())
    throw StoreError("set_on_close: " + std::to_string(keys.size()) + " keys but " +
                     std::to_string(values.size()) + " values");
  // etcd's TTLs are whole seconds (and it raises a short one to its minimum).
  const int64_t ttl = std::max<int64_t>(1, (im.lease_ttl.count() + 999) / 1000);
  json g = im.gateway.post("/v3/lease/grant", {{"TTL", std::to_string(ttl)}}, "lease grant");
  const int64_t id = num(g, "ID");
  if (id == 0) throw StoreError("etcd: lease grant returned no lease");
  json rec = {{"keys", json::array()}, {"values", json::array()}, {"counter", b64(counter)}};
  for (size_t i = 0; i < keys.size(); ++i) {
    rec["keys"].push_back(b64(keys[i]));
    rec["values"].push_back(b64(values[i]));
  }
  const std::string record = folder(keys[0]) + "on_close/" + std::to_string(id);
  im.txn(json::array(),
         json::array({put_op(record, to_bytes(rec.dump())), put_op(record + "/alive", to_bytes("1"), id)}),
         json::array(), "set_on_close(" + quoted_key(keys[0]) + ")");
  im.lease = id;
  im.record = record;
  im.next_refresh = Clock::now() + im.lease_ttl / 3;
  return true;
}

bool EtcdStore::settle_closed(const std::string& dir) {
  const std::string prefix = dir + "on_close/";
  json r = impl_->post("/v3/kv/range", {{"key", b64(prefix)}, {"range_end", b64(prefix_end(prefix))}},
                       "settle_closed(" + quoted_key(dir) + ")");
  if (!r.contains("kvs")) return true;
  // record key -> (mod_revision, value); and the records still alive.
  std::map<std::string, std::pair<int64_t, std::string>> records;
  std::vector<std::string> alive;
  for (const auto& kv : r["kvs"]) {
    std::string key = to_string(unb64(kv.value("key", "")));
    if (key.size() > 6 && key.compare(key.size() - 6, 6, "/alive") == 0) {
      alive.push_back(key.substr(0, key.size() - 6));
    } else {
      records[key] = {num(kv, "mod_revision"), to_string(unb64(kv.value("value", "")))};
    }
  }
  for (const auto& a : alive) records.erase(a);
  for (const auto& [key, rec] : records) impl_->apply(key, rec.first, rec.second);
  return true;
}

}  // namespace ddprun::rendezvous
