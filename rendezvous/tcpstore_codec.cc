#include "rendezvous/tcpstore_codec.h"

#include <cstring>

namespace ddprun::rendezvous::tcpstore {

namespace {

// torch 1.13's numbering, indexed by its opcode.
constexpr Op kLegacyOps[] = {Op::kSet,       Op::kCompareSet, Op::kGet,      Op::kAdd,
                             Op::kCheck,     Op::kWait,       Op::kGetNumKeys, Op::kWatchKey,
                             Op::kDeleteKey, Op::kAppend,     Op::kMultiGet, Op::kMultiSet,
                             Op::kCancelWait};
constexpr size_t kLegacyCount = sizeof kLegacyOps / sizeof kLegacyOps[0];

// Reads fields off the front of a buffer. Once a field does not fit, every
// later read fails too and `need` says how many bytes the frame needs at
// least; a declared length past a limit sets `error` instead.
struct Cursor {
  const uint8_t* p;
  size_t n;
  size_t at = 0;
  size_t need = 0;  // nonzero: short of bytes
  std::string error;
  bool build;  // false: only measure (no copies until the frame is complete)

  bool ok() const { return need == 0 && error.empty(); }
  bool fits(size_t len) {
    if (!ok()) return false;
    if (at + len > kMaxFrameSize) {
      error = "query larger than " + std::to_string(kMaxFrameSize) + " bytes";
      return false;
    }
    if (n - at < len) {
      need = at + len;
      return false;
    }
    return true;
  }
  uint64_t u64() {
    if (!fits(8)) return 0;
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = v << 8 | p[at + static_cast<size_t>(i)];
    at += 8;
    return v;
  }
  uint32_t u32() {
    if (!fits(4)) return 0;
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = v << 8 | p[at + static_cast<size_t>(i)];
    at += 4;
    return v;
  }
  // A length-prefixed string of at most `limit` bytes, copied into `out`
  // when building.
  template <typename T>
  void str(T* out, size_t limit, const char* what) {
    uint64_t len = u64();
    if (!ok()) return;
    if (len > limit) {
      error = std::string(what) + " of " + std::to_string(len) + " bytes exceeds the limit of " +
              std::to_string(limit);
      return;
    }
    if (!fits(static_cast<size_t>(len))) return;
    if (build && out) out->assign(p + at, p + at + len);
    at += static_cast<size_t>(len);
  }
  void key(std::vector<std::string>& keys) {
    std::string k;
    str(build ? &k : nullptr, kMaxKeySize, "key");
    if (build && ok()) keys.push_back(std::move(k));
  }
  void value(std::vector<Bytes>& values) {
    Bytes v;
    str(build ? &v : nullptr, kMaxValueSize, "value");
    if (build && ok()) values.push_back(std::move(v));
  }
  uint64_t count() {
    uint64_t c = u64();
    if (ok() && c > kMaxKeysPerQuery)
      error = std::to_string(c) + " keys in one query exceed the limit of " +
              std::to_string(kMaxKeysPerQuery);
    return ok() ? c : 0;
  }
};

// What follows a query's opcode (the layout in tcpstore_codec.h).
enum class Args { kNone, kU32, kKey, kKeyValue, kKeyTwoValues, kKeyNumber, kKeys, kKeyValuePairs };

Args args_of(Op op) {
  switch (op) {
    case Op::kValidate:
    case Op::kPing:
      return Args::kU32;
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
      return Args::kKeyValue;
    case Op::kCompareSet:
      return Args::kKeyTwoValues;
    case Op::kGet:
    case Op::kDeleteKey:
    case Op::kQueuePop:
    case Op::kQueueLen:
    case Op::kWatchKey:
      return Args::kKey;
    case Op::kAdd:
    case Op::kBarrier:
      return Args::kKeyNumber;
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      return Args::kKeys;
    case Op::kMultiSet:
      return Args::kKeyValuePairs;
    case Op::kGetNumKeys:
    case Op::kCancelWait:
    case Op::kListKeys:
      break;
  }
  return Args::kNone;
}

void parse_args(Cursor& c, Request& r) {
  switch (args_of(r.op)) {
    case Args::kU32:
      r.u32 = c.u32();
      break;
    case Args::kKey:
      c.key(r.keys);
      break;
    case Args::kKeyValue:
      c.key(r.keys);
      c.value(r.values);
      break;
    case Args::kKeyTwoValues:
      c.key(r.keys);
      c.value(r.values);
      c.value(r.values);
      break;
    case Args::kKeyNumber:
      c.key(r.keys);
      r.number = static_cast<int64_t>(c.u64());
      break;
    case Args::kKeys:
      for (uint64_t i = 0, n = c.count(); i < n && c.ok(); ++i) c.key(r.keys);
      break;
    case Args::kKeyValuePairs:
      for (uint64_t i = 0, n = c.count(); i < n && c.ok(); ++i) {
        c.key(r.keys);
        c.value(r.values);
      }
      break;
    case Args::kNone:
      break;
  }
}

}  // namespace

const char* op_name(Op op) {
  static const char* kNames[] = {"VALIDATE",   "SET",        "COMPARE_SET", "GET",       "ADD",
                                 "CHECK",      "WAIT",       "GETNUMKEYS",  "DELETE_KEY", "APPEND",
                                 "MULTI_GET",  "MULTI_SET",  "CANCEL_WAIT", "PING",      "QUEUE_PUSH",
                                 "QUEUE_POP",  "QUEUE_LEN",  "LIST_KEYS",   "BARRIER",   "WATCH_KEY"};
  auto i = static_cast<size_t>(op);
  return i < sizeof kNames / sizeof kNames[0] ? kNames[i] : "?";
}

Dialect detect_dialect(const uint8_t* p, size_t n) {
  if (n == 0) return Dialect::kUnknown;
  if (p[0] != 0) return Dialect::kLegacy;
  const uint8_t magic[4] = {0xCE, 0xF7, 0x85, 0x3C};
  size_t have = n - 1 < 4 ? n - 1 : 4;
  if (std::memcmp(p + 1, magic, have) != 0) return Dialect::kLegacy;
  return have == 4 ? Dialect::kV2 : Dialect::kUnknown;
}

uint8_t opcode(Dialect d, Op op) {
  if (d != Dialect::kLegacy) return op == Op::kWatchKey ? 0xff : static_cast<uint8_t>(op);
  for (size_t i = 0; i < kLegacyCount; ++i)
    if (kLegacyOps[i] == op) return static_cast<uint8_t>(i);
  return 0xff;
}

ParseResult parse_request(Dialect d, const uint8_t* p, size_t n) {
  ParseResult res;
  if (n == 0) {
    res.need = 1;
    return res;
  }
  Request r;
  uint8_t code = p[0];
  if (d == Dialect::kLegacy) {
    if (code >= kLegacyCount) {
      res.kind = ParseResult::kError;
      res.error = "unknown query " + std::to_string(code) + " (torch 1.13 numbering)";
      return res;
    }
    r.op = kLegacyOps[code];
  } else {
    if (code >= static_cast<uint8_t>(Op::kWatchKey)) {
      res.kind = ParseResult::kError;
      res.error = "unknown query " + std::to_string(code) + " (torch 2.x numbering)";
      return res;
    }
    r.op = static_cast<Op>(code);
  }
  // Measure first: a big frame arriving in chunks costs a walk over its
  // length fields per chunk, not a copy of everything received so far.
  Cursor m{p, n, 1, 0, {}, false};
  parse_args(m, r);
  if (!m.error.empty()) {
    res.kind = ParseResult::kError;
    res.error = std::string(op_name(r.op)) + ": " + m.error;
    return res;
  }
  if (m.need != 0) {
    res.need = m.need;
    return res;
  }
  Cursor b{p, n, 1, 0, {}, true};
  parse_args(b, r);
  res.kind = ParseResult::kOk;
  res.consumed = b.at;
  res.request = std::move(r);
  return res;
}

void put_u8(Bytes& out, uint8_t v) { out.push_back(v); }
void put_u32(Bytes& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u64(Bytes& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_i64(Bytes& out, int64_t v) { put_u64(out, static_cast<uint64_t>(v)); }
void put_string(Bytes& out, const uint8_t* p, size_t n) {
  put_u64(out, n);
  out.insert(out.end(), p, p + n);
}

Bytes encode_request(Dialect d, const Request& r) {
  const uint8_t code = opcode(d, r.op);
  if (code == 0xff) return {};
  Bytes out{code};
  switch (args_of(r.op)) {
    case Args::kU32:
      put_u32(out, r.u32);
      break;
    case Args::kKey:
      put_string(out, r.keys.at(0));
      break;
    case Args::kKeyValue:
    case Args::kKeyTwoValues:
      put_string(out, r.keys.at(0));
      for (const auto& v : r.values) put_string(out, v);
      break;
    case Args::kKeyNumber:
      put_string(out, r.keys.at(0));
      put_i64(out, r.number);
      break;
    case Args::kKeys:
      put_u64(out, r.keys.size());
      for (const auto& k : r.keys) put_string(out, k);
      break;
    case Args::kKeyValuePairs:
      put_u64(out, r.keys.size());
      for (size_t i = 0; i < r.keys.size(); ++i) {
        put_string(out, r.keys[i]);
        put_string(out, r.values.at(i));
      }
      break;
    case Args::kNone:
      break;
  }
  return out;
}

}  // namespace ddprun::rendezvous::tcpstore
