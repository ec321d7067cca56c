#include "rendezvous/wire.h"

#include <algorithm>
#include <cstring>

namespace ddprun::rendezvous::wire {

const char* op_name(Op op) {
  switch (op) {
    case Op::kAuth: return "auth";
    case Op::kSet: return "set";
    case Op::kGet: return "get";
    case Op::kAdd: return "add";
    case Op::kCompareSet: return "compare_set";
    case Op::kWait: return "wait";
    case Op::kCheck: return "check";
    case Op::kDelete: return "delete";
    case Op::kNumKeys: return "num_keys";
    case Op::kAppend: return "append";
    case Op::kMultiGet: return "multi_get";
    case Op::kMultiSet: return "multi_set";
    case Op::kPing: return "ping";
    case Op::kOnClose: return "on_close";
  }
  return "unknown";
}

// ---------------------------------------------------------------- Writer
Writer::Writer(Bytes& out) : out_(out), start_(out.size()) {
  out_.resize(out_.size() + kHeaderSize);
}

Writer::~Writer() {
  uint32_t n = static_cast<uint32_t>(out_.size() - start_ - kHeaderSize);
  for (int i = 0; i < 4; ++i) out_[start_ + i] = static_cast<uint8_t>(n >> (8 * i));
}

void Writer::u8(uint8_t v) { out_.push_back(v); }
void Writer::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void Writer::u64(uint64_t v) {
  for (int i = 0; i < 8; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void Writer::str(const void* data, size_t size) {
  u32(static_cast<uint32_t>(size));
  const auto* p = static_cast<const uint8_t*>(data);
  out_.insert(out_.end(), p, p + size);
}

// ---------------------------------------------------------------- Reader
bool Reader::u8(uint8_t& v) {
  if (left() < 1) return false;
  v = *p_++;
  return true;
}
namespace {

// A little-endian unsigned of sizeof(T) bytes at `p`, advanced past it;
// false, reading nothing, when fewer are `left`.
template <typename T>
bool read_le(const uint8_t*& p, size_t left, T& v) {
  if (left < sizeof(T)) return false;
  v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(p[i]) << (8 * i);
  p += sizeof(T);
  return true;
}

}  // namespace

bool Reader::u32(uint32_t& v) { return read_le(p_, left(), v); }
bool Reader::u64(uint64_t& v) { return read_le(p_, left(), v); }
bool Reader::str(std::string& s, size_t max_len) {
  uint32_t n;
  if (!u32(n) || n > max_len || n > left()) return false;
  s.assign(reinterpret_cast<const char*>(p_), n);
  p_ += n;
  return true;
}
bool Reader::bytes(Bytes& b, size_t max_len) {
  uint32_t n;
  if (!u32(n) || n > max_len || n > left()) return false;
  b.assign(p_, p_ + n);
  p_ += n;
  return true;
}

bool is_tcpstore_hello(const uint8_t* data, size_t size) {
  return size >= sizeof kTcpStoreHello &&
         std::equal(kTcpStoreHello, kTcpStoreHello + sizeof kTcpStoreHello, data);
}

std::optional<uint32_t> frame_length(const uint8_t* data, size_t size) {
  if (size < kHeaderSize) return std::nullopt;
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(data[i]) << (8 * i);
  return n;
}

// ---------------------------------------------------------------- parsing
namespace {

ParseResult fail(std::string message) {
  ParseResult r;
  r.kind = ParseResult::kError;
  r.error = std::move(message);
  return r;
}

// Reads `strs`: a count then that many keys.
bool read_keys(Reader& in, std::vector<std::string>& keys, std::string& error) {
  uint32_t count;
  if (!in.u32(count)) return error = "truncated key count", false;
  if (count == 0 || count > kMaxKeysPerRequest) {
    error = "key count " + std::to_string(count) + " outside 1.." +
            std::to_string(kMaxKeysPerRequest);
    return false;
  }
  // Each key needs at least its 4-byte length: refuse counts the payload
  // cannot hold before reserving anything.
  if (count > in.left() / 4) return error = "truncated key list", false;
  keys.resize(count);
  for (auto& k : keys) {
    if (!in.str(k, kMaxKeySize)) {
      error = "key longer than " + std::to_string(kMaxKeySize) + " bytes or truncated";
      return false;
    }
  }
  return true;
}

bool read_key(Reader& in, Request& r, std::string& error) {
  r.keys.resize(1);
  if (!in.str(r.keys[0], kMaxKeySize)) {
    error = "key longer than " + std::to_string(kMaxKeySize) + " bytes or truncated";
    return false;
  }
  return true;
}

bool read_value(Reader& in, Request& r, std::string& error) {
  r.values.emplace_back();
  if (!in.bytes(r.values.back(), kMaxValueSize)) {
    error = "value longer than " + std::to_string(kMaxValueSize) + " bytes or truncated";
    return false;
  }
  return true;
}

// Reads `count, (str key, bytes value)[count]` with min_count <= count <=
// kMaxKeysPerRequest. Each pair needs its two 4-byte lengths: counts the
// payload cannot hold are refused before anything is reserved.
bool read_pairs(Reader& in, Request& q, uint32_t min_count, std::string& error) {
  uint32_t count;
  if (!in.u32(count)) return error = "truncated pair count", false;
  if (count < min_count || count > kMaxKeysPerRequest || count > in.left() / 8) {
    error = "pair count " + std::to_string(count) +
            (min_count ? " outside 1.." : " over ") + std::to_string(kMaxKeysPerRequest) +
            " or truncated";
    return false;
  }
  q.keys.resize(count);
  q.values.resize(count);
  for (uint32_t i = 0; i < count; ++i)
    if (!in.str(q.keys[i], kMaxKeySize) || !in.bytes(q.values[i], kMaxValueSize))
      return error = "key or value over its limit, or truncated", false;
  return true;
}

bool read_timeout(Reader& in, Request& r, std::string& error) {
  if (!in.u64(r.timeout_ms)) return error = "truncated timeout", false;
  if (r.timeout_ms > kMaxTimeoutMs) r.timeout_ms = kMaxTimeoutMs;
  return true;
}

}  // namespace

ParseResult parse_request(const uint8_t* data, size_t size) {
  auto n = frame_length(data, size);
  if (!n) return ParseResult{};
  if (*n > kMaxFrameSize) {
    return fail("frame of " + std::to_string(*n) + " bytes exceeds the limit of " +
                std::to_string(kMaxFrameSize));
  }
  if (*n == 0) return fail("empty frame");
  if (size - kHeaderSize < *n) return ParseResult{};

  Reader in(data + kHeaderSize, *n);
  ParseResult r;
  Request& q = r.request;
  uint8_t op;
  in.u8(op);
  q.op = static_cast<Op>(op);
  std::string error;
  bool ok = true;
  switch (q.op) {
    case Op::kAuth:
      ok = in.bytes(q.values.emplace_back(), kMacSize) && q.values[0].size() == kMacSize &&
           in.bytes(q.values.emplace_back(), kNonceSize) && q.values[1].size() == kNonceSize;
      if (!ok) {
        error = "auth needs a " + std::to_string(kMacSize) + "-byte mac and a " +
                std::to_string(kNonceSize) + "-byte nonce";
      }
      break;
    case Op::kSet:
    case Op::kAppend:
      ok = read_key(in, q, error) && read_value(in, q, error);
      break;
    case Op::kGet:
      ok = read_timeout(in, q, error) && read_key(in, q, error);
      break;
    case Op::kAdd: {
      uint64_t d = 0;
      ok = read_key(in, q, error) && in.u64(d);
      if (!ok && error.empty()) error = "truncated delta";
      q.delta = static_cast<int64_t>(d);
      break;
    }
    case Op::kCompareSet:
      ok = read_key(in, q, error) && read_value(in, q, error) && read_value(in, q, error);
      break;
    case Op::kWait:
    case Op::kMultiGet:
      ok = read_timeout(in, q, error) && read_keys(in, q.keys, error);
      break;
    case Op::kCheck:
      ok = read_keys(in, q.keys, error);
      break;
    case Op::kDelete:
      ok = read_key(in, q, error);
      break;
    case Op::kNumKeys:
    case Op::kPing:
      break;
    case Op::kMultiSet:
      ok = read_pairs(in, q, 1, error);
      break;
    case Op::kOnClose: {
      ok = read_pairs(in, q, 0, error);
      if (ok) {
        ok = in.str(q.counter, kMaxKeySize);
        if (!ok) error = "key, value or counter over its limit, or truncated";
      }
      break;
    }
    default:
      return fail("unknown opcode " + std::to_string(op));
  }
  if (!ok) return fail(std::string(op_name(q.op)) + ": " + error);
  if (!in.done()) {
    return fail(std::string(op_name(q.op)) + ": " + std::to_string(in.left()) +
                " trailing bytes");
  }
  r.kind = ParseResult::kOk;
  r.consumed = kHeaderSize + *n;
  return r;
}

Bytes encode_request(const Request& q) {
  Bytes out;
  {
    Writer w(out);
    w.u8(static_cast<uint8_t>(q.op));
    auto keys = [&] {
      w.u32(static_cast<uint32_t>(q.keys.size()));
      for (const auto& k : q.keys) w.str(k);
    };
    switch (q.op) {
      case Op::kAuth: w.str(q.values.at(0)); w.str(q.values.at(1)); break;
      case Op::kSet:
      case Op::kAppend: w.str(q.keys.at(0)); w.str(q.values.at(0)); break;
      case Op::kGet: w.u64(q.timeout_ms); w.str(q.keys.at(0)); break;
      case Op::kAdd: w.str(q.keys.at(0)); w.u64(static_cast<uint64_t>(q.delta)); break;
      case Op::kCompareSet:
        w.str(q.keys.at(0)); w.str(q.values.at(0)); w.str(q.values.at(1));
        break;
      case Op::kWait:
      case Op::kMultiGet: w.u64(q.timeout_ms); keys(); break;
      case Op::kCheck: keys(); break;
      case Op::kDelete: w.str(q.keys.at(0)); break;
      case Op::kNumKeys:
      case Op::kPing: break;
      case Op::kMultiSet:
      case Op::kOnClose:
        w.u32(static_cast<uint32_t>(q.keys.size()));
        for (size_t i = 0; i < q.keys.size(); ++i) {
          w.str(q.keys[i]);
          w.str(q.values.at(i));
        }
        if (q.op == Op::kOnClose) w.str(q.counter);
        break;
    }
  }
  return out;
}

Bytes encode_greeting(const Greeting& g) {
  Bytes out;
  {
    Writer w(out);
    for (char c : kMagic) w.u8(static_cast<uint8_t>(c));
    w.u8(kVersion);
    w.u8(g.auth_required ? 1 : 0);
    Bytes nonce = g.nonce;
    nonce.resize(kNonceSize);
    for (uint8_t b : nonce) w.u8(b);
  }
  return out;
}

Reply parse_reply(Op op, const uint8_t* data, size_t size, size_t expected_values) {
  Reply r;
  if (size == 0) return r.error = "empty reply", r;
  if (data[0] > static_cast<uint8_t>(Status::kError)) {
    return r.error = "unknown status " + std::to_string(data[0]), r;
  }
  r.status = static_cast<Status>(data[0]);
  Reader in(data + 1, size - 1);
  bool ok = true;
  if (r.status == Status::kError) {
    ok = in.str(r.message, kMaxFrameSize);
  } else if (r.status == Status::kTimeout) {
    ok = op == Op::kGet || op == Op::kWait || op == Op::kMultiGet;  // only these block
  } else if (r.status == Status::kOk) {
    switch (op) {
      case Op::kAuth:
      case Op::kGet:
      case Op::kCompareSet:
        ok = in.bytes(r.value, kMaxFrameSize);
        if (ok && op == Op::kAuth && r.value.size() != kMacSize) ok = false;
        break;
      case Op::kAdd:
      case Op::kNumKeys: {
        uint64_t v = 0;
        ok = in.u64(v);
        r.number = static_cast<int64_t>(v);
        break;
      }
      case Op::kCheck:
      case Op::kDelete: {
        uint8_t b = 0;
        ok = in.u8(b) && b <= 1;
        r.flag = b == 1;
        break;
      }
      case Op::kMultiGet: {
        uint32_t n = 0;
        ok = in.u32(n) && n == expected_values && n <= in.left() / 4;
        if (ok) r.values.resize(n);
        for (uint32_t i = 0; ok && i < n; ++i) ok = in.bytes(r.values[i], kMaxFrameSize);
        break;
      }
      default:
        break;
    }
  }
  if (!ok || !in.done()) {
    r.status = Status::kError;
    r.error = std::string("malformed reply to ") + op_name(op);
  }
  return r;
}

std::optional<Greeting> parse_greeting(const uint8_t* data, size_t size) {
  if (size != 4 + 1 + 1 + kNonceSize || std::memcmp(data, kMagic, 4) != 0) return std::nullopt;
  if (data[4] != kVersion || data[5] > 1) return std::nullopt;
  Greeting g;
  g.auth_required = data[5] == 1;
  g.nonce.assign(data + 6, data + 6 + kNonceSize);
  return g;
}

}  // namespace ddprun::rendezvous::wire
