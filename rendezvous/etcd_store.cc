#include "rendezvous/etcd_store.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>
#include <cstring>
#include <optional>
#include <thread>

#include "rendezvous/client.h"  // parse_host_port

namespace ddprun::rendezvous {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
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

std::string quoted(const std::string& key) { return "'" + key.substr(0, 128) + "'"; }

}  // namespace

struct EtcdStore::Impl {
  EtcdOptions options;
  std::vector<std::pair<std::string, uint16_t>> endpoints;
  size_t current = 0;  // the endpoint the connection goes to
  asio::io_context io;
  std::optional<beast::tcp_stream> stream;

  // POSTs `body` to `path`; returns the reply's JSON. Tries each endpoint
  // once; throws StoreError naming them and the last failure.
  json post(const std::string& path, const json& body, const std::string& what) {
    std::string errors;
    for (size_t attempt = 0; attempt < endpoints.size(); ++attempt) {
      const auto& [host, port] = endpoints[current];
      const std::string where = host + ":" + std::to_string(port);
      try {
        return post_once(host, port, path, body.dump());
      } catch (const StoreError& e) {
        errors += (errors.empty() ? "" : "; ") + where + ": " + e.what();
      } catch (const std::exception& e) {
        errors += (errors.empty() ? "" : "; ") + where + ": " + e.what();
      }
      stream.reset();
      current = (current + 1) % endpoints.size();
    }
    throw StoreError("etcd " + what + " failed at every endpoint (" + errors + ")");
  }

  json post_once(const std::string& host, uint16_t port, const std::string& path,
                 const std::string& body) {
    if (!stream) {
      stream.emplace(io);
      stream->expires_after(options.request_timeout);
      asio::ip::tcp::resolver resolver(io);
      stream->connect(resolver.resolve(host, std::to_string(port)));
    }
    http::request<http::string_body> req{http::verb::post, path, 11};
    req.set(http::field::host, host);
    req.set(http::field::content_type, "application/json");
    req.keep_alive(true);
    req.body() = body;
    req.prepare_payload();
    stream->expires_after(options.request_timeout);
    http::write(*stream, req);
    beast::flat_buffer buf;
    http::response<http::string_body> res;
    http::read(*stream, buf, res);
    if (!res.keep_alive()) stream.reset();
    json j = json::parse(res.body(), nullptr, false);
    if (res.result() != http::status::ok || j.is_discarded()) {
      std::string msg = j.is_discarded() ? res.body().substr(0, 200)
                                         : j.value("message", j.value("error", res.body().substr(0, 200)));
      throw StoreError("HTTP " + std::to_string(res.result_int()) + ": " + msg);
    }
    return j;
  }

  // nullopt when absent; else (value, mod_revision).
  std::optional<std::pair<Bytes, int64_t>> range(const std::string& key) {
    json r = post("/v3/kv/range", {{"key", b64(key)}}, "range(" + quoted(key) + ")");
    if (!r.contains("kvs") || r["kvs"].empty()) return std::nullopt;
    const json& kv = r["kvs"][0];
    return std::make_pair(unb64(kv.value("value", "")), num(kv, "mod_revision"));
  }

  // A transaction: put `desired` if `key` is absent (expected empty) or
  // holds `expected` (by value, or by mod_revision when rev > 0).
  // Returns (succeeded, value after).
  std::pair<bool, Bytes> cas(const std::string& key, const Bytes& expected, const Bytes& desired,
                             int64_t rev, bool absent) {
    json cmp;
    if (absent) {
      cmp = {{"result", "EQUAL"}, {"target", "CREATE"}, {"key", b64(key)}, {"create_revision", "0"}};
    } else if (rev > 0) {
      cmp = {{"result", "EQUAL"}, {"target", "MOD"}, {"key", b64(key)},
             {"mod_revision", std::to_string(rev)}};
    } else {
      cmp = {{"result", "EQUAL"}, {"target", "VALUE"}, {"key", b64(key)}, {"value", b64(expected)}};
    }
    json txn = {{"compare", json::array({cmp})},
                {"success", json::array({{{"request_put", {{"key", b64(key)}, {"value", b64(desired)}}}}})},
                {"failure", json::array({{{"request_range", {{"key", b64(key)}}}}})}};
    json r = post("/v3/kv/txn", txn, "compare_set(" + quoted(key) + ")");
    if (r.value("succeeded", false)) return {true, desired};
    Bytes now;
    if (r.contains("responses") && !r["responses"].empty()) {
      const json& rr = r["responses"][0].value("response_range", json::object());
      if (rr.contains("kvs") && !rr["kvs"].empty()) now = unb64(rr["kvs"][0].value("value", ""));
    }
    return {false, now};
  }
};

EtcdStore::EtcdStore(EtcdOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  std::string list = impl_->options.endpoints;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    std::string ep = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (ep.rfind("http://", 0) == 0) ep = ep.substr(7);
    if (!ep.empty() && ep.back() == '/') ep.pop_back();
    if (ep.empty()) throw StoreError("etcd endpoints '" + list + "': an empty endpoint");
    if (ep.find(':') == std::string::npos) ep += ":2379";
    impl_->endpoints.push_back(parse_host_port(ep, "etcd endpoint"));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
}

EtcdStore::~EtcdStore() = default;

void EtcdStore::set(const std::string& key, const Bytes& value) {
  impl_->post("/v3/kv/put", {{"key", b64(key)}, {"value", b64(value)}}, "set(" + quoted(key) + ")");
}

Bytes EtcdStore::get(const std::string& key, Duration timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (auto v = impl_->range(key)) return v->first;
    if (Clock::now() >= deadline)
      throw TimeoutError("etcd: get(" + quoted(key) + ") timed out after " +
                         std::to_string(timeout.count()) + " ms");
    std::this_thread::sleep_for(std::min<Duration>(
        impl_->options.poll_interval,
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
        throw StoreError("etcd: add: value at " + quoted(key) + " is not an integer");
      }
    }
    Bytes next = to_bytes(std::to_string(v + delta));
    if (impl_->cas(key, {}, next, cur ? cur->second : 0, !cur).first) return v + delta;
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
  json r = impl_->post("/v3/kv/deleterange", {{"key", b64(key)}}, "remove(" + quoted(key) + ")");
  return num(r, "deleted") > 0;
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

}  // namespace ddprun::rendezvous
