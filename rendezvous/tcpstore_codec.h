// c10d's TCPStore wire protocol, as torch's C++ client (TCPStore.cpp) sends
// it, parsed by a pure function (no I/O, no allocation until a frame is
// complete) that tcpstore_server.cc and its tests share.
//
// The layout (little-endian, no framing: each query's arguments follow its
// opcode byte):
//   string := u64 n, byte[n]            (keys and values alike)
//   keys   := u64 count, string[count]
//   VALIDATE    u32 0x3C85F7CE                    (no reply)
//   PING        u32 nonce                       -> u32 nonce
//   SET         key value                       (no reply)
//   COMPARE_SET key expected desired            -> string (the value now)
//   GET         key                             -> string (empty if absent)
//   ADD         key i64                         -> i64 (value stored as decimal)
//   CHECK       keys                            -> u8 READY 0 / NOT_READY 1
//   WAIT        keys                            -> u8 STOP_WAITING 0, once all exist
//   GETNUMKEYS                                  -> i64
//   DELETE_KEY  key                             -> i64 (keys deleted)
//   APPEND      key value                       (no reply)
//   MULTI_GET   keys                            -> string[count]
//   MULTI_SET   u64 count, (key value)[count]   (no reply)
//   CANCEL_WAIT                                 -> u8 WAIT_CANCELED 1
//   QUEUE_PUSH  key value                       (no reply)
//   QUEUE_POP   key                             -> i64 length, string if length > 0
//   QUEUE_LEN   key                             -> i64
//   LIST_KEYS                                   -> i64 n, string[n]
//   BARRIER     key i64 world                   -> u8 STOP_WAITING once `world` arrived
//
// Two numberings exist. torch >= 2.1 (2.15 included): VALIDATE 0, SET 1, ...
// as listed, and its client's first bytes on every connection are VALIDATE
// and the magic. torch 1.13 (and 2.0): SET 0, COMPARE_SET 1, GET 2, ADD 3,
// CHECK 4, WAIT 5, GETNUMKEYS 6, WATCH_KEY 7, DELETE_KEY 8, APPEND 9,
// MULTI_GET 10, MULTI_SET 11, CANCEL_WAIT 12; no VALIDATE. A connection's
// dialect is told by its first 5 bytes (detect_dialect): a 1.13 SET cannot
// start with them, as that would announce a key of about 1 GB.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddprun::rendezvous::tcpstore {

using Bytes = std::vector<uint8_t>;

constexpr uint32_t kValidateMagic = 0x3C85F7CE;
// The one-byte replies: CHECK's (torch's CheckResponseType) and WAIT's,
// BARRIER's and CANCEL_WAIT's (WaitResponseType).
constexpr uint8_t kReady = 0, kNotReady = 1;
constexpr uint8_t kStopWaiting = 0, kWaitCanceled = 1;
// Bounds a frame may not break (torch's libuv server has 8 KiB keys, 8 MiB
// values, 128 Ki keys a query; ours are as roomy, and bound the sum too).
constexpr size_t kMaxKeySize = 64 * 1024;
constexpr size_t kMaxValueSize = size_t{64} << 20;
constexpr size_t kMaxKeysPerQuery = 128 * 1024;
constexpr size_t kMaxFrameSize = size_t{80} << 20;

// The queries, numbered as torch 2.x numbers them.
enum class Op : uint8_t {
  kValidate = 0,
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kGetNumKeys,
  kDeleteKey,
  kAppend,
  kMultiGet,
  kMultiSet,
  kCancelWait,
  kPing,
  kQueuePush,
  kQueuePop,
  kQueueLen,
  kListKeys,
  kBarrier,
  kWatchKey,  // torch 1.13 only (its callback client); refused
};
const char* op_name(Op op);

enum class Dialect { kUnknown, kLegacy, kV2 };

// The dialect of a connection whose first `n` bytes are `p`; kUnknown while
// too few bytes have arrived to tell.
Dialect detect_dialect(const uint8_t* p, size_t n);

struct Request {
  Op op = Op::kValidate;
  std::vector<std::string> keys;
  std::vector<Bytes> values;  // SET/APPEND/QUEUE_PUSH: 1; COMPARE_SET: 2; MULTI_SET: per key
  int64_t number = 0;         // ADD's delta, BARRIER's world size
  uint32_t u32 = 0;           // VALIDATE's magic, PING's nonce
};

struct ParseResult {
  enum Kind { kNeedMore, kError, kOk } kind = kNeedMore;
  size_t consumed = 0;   // kOk: the frame's length
  size_t need = 0;       // kNeedMore: parse again once this many bytes are there
  Request request;       // kOk
  std::string error;     // kError: what is wrong, for the log line
};

// Parses the query at the front of `p[0, n)`.
ParseResult parse_request(Dialect d, const uint8_t* p, size_t n);

// Reply and request encoding (the server's replies; tests' requests).
void put_u8(Bytes& out, uint8_t v);
void put_u32(Bytes& out, uint32_t v);
void put_i64(Bytes& out, int64_t v);
void put_u64(Bytes& out, uint64_t v);
void put_string(Bytes& out, const uint8_t* p, size_t n);
inline void put_string(Bytes& out, const Bytes& v) { put_string(out, v.data(), v.size()); }
inline void put_string(Bytes& out, const std::string& v) {
  put_string(out, reinterpret_cast<const uint8_t*>(v.data()), v.size());
}
// The opcode byte of `op` in dialect `d` (kUnknown counts as kV2); 0xff
// when `d` has no such query.
uint8_t opcode(Dialect d, Op op);
// The bytes of query `r` in dialect `d`, as torch's client sends them:
// parse_request(d, ...) gives `r` back. Empty when `d` has no such query.
Bytes encode_request(Dialect d, const Request& r);

}  // namespace ddprun::rendezvous::tcpstore
