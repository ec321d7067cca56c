// The store's wire format: opcodes, limits and byte layout, in one place.
//
// Client and server both include this header; nothing else knows the bytes.
// The request parser is a pure function (bytes in -> request or error) so
// the fuzzer can drive it without sockets. Thread-compatible, no state.
//
// Byte layout (all integers little-endian):
//
//   frame    := u32 n, payload[n]              (n <= kMaxFrameSize)
//   str      := u32 len, byte[len]
//   strs     := u32 count, str[count]          (count <= kMaxKeysPerRequest)
//
//   greeting (server -> client, first frame on every connection):
//     "DDPS" u8 version u8 auth_required byte[32] server_nonce
//     The server hands it to the kernel when it accepts, before it reads
//     a byte, so a connection that ends before its greeting served nothing
//     (a refusal at accept). A client without a token sends its first
//     requests without waiting for it and reads it in front of the first
//     reply; a client with a token waits for it (its nonce) and for the
//     store's proof before it sends any request.
//   request payload := u8 opcode, fields:
//     kAuth      str mac, str client_nonce
//                mac = HMAC-SHA256(token, kClientAuthLabel server_nonce client_nonce)
//     kSet       str key, str value
//     kGet       u64 timeout_ms, str key
//     kAdd       str key, i64 delta
//     kCompareSet str key, str expected, str desired
//     kWait      u64 timeout_ms, strs keys
//     kCheck     strs keys
//     kDelete    str key
//     kNumKeys   (nothing)
//     kAppend    str key, str value
//     kMultiGet  u64 timeout_ms, strs keys
//     kMultiSet  u32 count, (str key, str value)[count]
//     kPing      (nothing)
//     kOnClose   u32 count, (str key, str value)[count], str counter
//                (count 0 cancels; see "on close" below)
//   response payload := u8 status, fields:
//     kOk        op-specific: kAuth -> str server_mac, where server_mac =
//                HMAC-SHA256(token, kServerAuthLabel client_nonce server_nonce)
//                (the store proves it knows the token too); kGet/kCompareSet -> str value; kAdd/kNumKeys ->
//                i64; kCheck/kDelete -> u8 bool; kMultiGet -> strs values;
//                others -> nothing
//     kTimeout   (nothing: the client names its keys and deadline)
//     kError     str message
//
// On close: kOnClose leaves writes with the server for when this connection
// closes other than by the server's own shutdown (the client process died,
// its link broke): when the first pair's key is absent, every pair is set
// and `counter` (when not empty) is incremented by 1; otherwise nothing
// happens. A later kOnClose replaces an earlier one. The rendezvous
// ends a round this way the moment a member's agent dies.
//
// Requests on one connection are answered in order. Blocking operations
// (get, wait, multi-get) hold the connection's later requests until they
// are answered. Any frame that cannot be parsed gets a kError reply and the
// connection is closed, since the stream cannot be resynchronised. Before
// authentication only frames up to kMaxPreAuthFrameSize are accepted.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::rendezvous::wire {

using Bytes = std::vector<uint8_t>;

// --- Limits. Every buffer the server keeps is bounded by one of these. ---
constexpr size_t kMaxKeySize = 4096;
constexpr size_t kMaxValueSize = 1 << 20;      // 1 MiB
constexpr size_t kMaxKeysPerRequest = 8192;    // enough for an all-gather of 8192 ranks
constexpr size_t kMaxFrameSize = 4 << 20;      // 4 MiB, both directions
// Before a connection has authenticated, the only legal frame is kAuth (77
// bytes): anything longer is refused at its header, so a client without the
// token can make the server hold at most this much.
constexpr size_t kMaxPreAuthFrameSize = 128;
constexpr size_t kMaxConnections = 16384;      // default ServerOptions limit
// One peer address may hold at most this many connections (a barrier of
// every rank of a big host still fits), so one host cannot take every slot.
constexpr size_t kMaxConnectionsPerPeer = 2048;
// Connections that have not authenticated yet (token set): at most this
// many in all and kMaxUnauthenticatedPerPeer from one address; beyond that
// new ones are refused at accept.
// When every slot is taken, a newcomer evicts the oldest unauthenticated
// connection of the /24 (IPv6: /64) and then the address holding the most,
// if that holds more than the newcomer's own address: a few peers cannot
// keep everyone else out by holding the slots and reconnecting. One /24
// holds at most kMaxUnauthenticatedPerSubnet; with those taken, a newcomer
// of that /24 evicts the same way among its addresses (an attacker on the
// agents' own subnet).
constexpr size_t kMaxUnauthenticated = 1024;
constexpr size_t kMaxUnauthenticatedPerPeer = 64;
constexpr size_t kMaxUnauthenticatedPerSubnet = 256;
// Bytes of requests being received, requests blocked in get/wait/multi-get
// and replies not yet sent, summed over every connection. When a read or a
// reply would pass it, the connection holding the most is closed (a client
// that does not read its replies is closed, not buffered for). Blocked
// requests asking the same keys (every rank of an all-gather) hold one
// copy of them between them, so an all-gather of kMaxKeysPerRequest ranks
// with short keys holds about 8192 x 200 bytes of keys plus a few hundred
// bytes a rank: well within this limit.
constexpr size_t kMaxBufferedBytes = 32 << 20;  // 32 MiB
constexpr uint64_t kMaxTimeoutMs = 7ull * 24 * 3600 * 1000;  // longer is clamped
// A connection with a partial frame must complete it within this window, or
// it is closed (slow-loris); so must a connection that owes an auth reply.
constexpr std::chrono::milliseconds kPartialFrameTimeout{10000};
constexpr std::chrono::milliseconds kHandshakeTimeout{10000};
// Memory the server's table may use for keys and values, each entry charged
// with its bookkeeping (Table::entry_bytes); writes beyond it fail.
constexpr size_t kMaxStoreBytes = size_t{1} << 30;  // 1 GiB

constexpr uint8_t kVersion = 2;  // 2: mutual authentication
constexpr size_t kNonceSize = 32;
constexpr size_t kMacSize = 32;
constexpr char kMagic[4] = {'D', 'D', 'P', 'S'};
// Distinct labels, so neither side's answer can be reflected as the other's.
constexpr char kClientAuthLabel[] = "ddprun-store-auth-v2 client";
constexpr char kServerAuthLabel[] = "ddprun-store-auth-v2 server";
constexpr size_t kHeaderSize = 4;

enum class Op : uint8_t {
  kAuth = 1,
  kSet = 2,
  kGet = 3,
  kAdd = 4,
  kCompareSet = 5,
  kWait = 6,
  kCheck = 7,
  kDelete = 8,
  kNumKeys = 9,
  kAppend = 10,
  kMultiGet = 11,
  kMultiSet = 12,
  kPing = 13,
  kOnClose = 14,
};
const char* op_name(Op op);

enum class Status : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };

// A parsed request. Fields not used by `op` stay empty.
struct Request {
  Op op = Op::kPing;
  std::vector<std::string> keys;  // one for single-key ops
  std::vector<Bytes> values;      // value / expected+desired / multi-set values / mac+nonce
  int64_t delta = 0;
  uint64_t timeout_ms = 0;
  std::string counter;            // kOnClose only
};

struct Greeting {
  bool auth_required = false;
  Bytes nonce;  // kNonceSize bytes
};

// Outcome of looking at the front of a byte stream.
struct ParseResult {
  enum Kind { kNeedMore, kOk, kError } kind = kNeedMore;
  size_t consumed = 0;  // bytes of the frame, when kOk
  Request request;      // when kOk
  std::string error;    // when kError: names the field and the limit
};

// Parses one request frame from the front of [data, data+size). Never reads
// past `size`, never allocates more than the frame's own (bounded) contents.
ParseResult parse_request(const uint8_t* data, size_t size);

// Encoding. Each returns a whole frame (header included).
Bytes encode_request(const Request& request);
Bytes encode_greeting(const Greeting& greeting);

// Response building: a writer that appends fields and patches the length.
class Writer {
 public:
  explicit Writer(Bytes& out);  // appends one frame to `out`
  ~Writer();                    // patches the frame length
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;
  void u8(uint8_t v);
  void u32(uint32_t v);
  void u64(uint64_t v);
  void str(const void* data, size_t size);
  void str(const std::string& s) { str(s.data(), s.size()); }
  void str(const Bytes& b) { str(b.data(), b.size()); }

 private:
  Bytes& out_;
  size_t start_;
};

// Bounds-checked reader over one payload; every read returns false when the
// payload is too short or a length breaks `max_len`.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  bool u8(uint8_t& v);
  bool u32(uint32_t& v);
  bool u64(uint64_t& v);
  bool str(std::string& s, size_t max_len);
  bool bytes(Bytes& b, size_t max_len);
  bool done() const { return p_ == end_; }
  size_t left() const { return static_cast<size_t>(end_ - p_); }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// A response payload decoded for the request op it answers (the client's
// side; pure so it can be fuzzed). `error` is set when the payload does not
// have the shape `op`'s reply must have.
struct Reply {
  Status status = Status::kError;
  std::string message;        // kError
  Bytes value;                // kGet, kCompareSet, kAuth (server mac)
  int64_t number = 0;         // kAdd, kNumKeys
  bool flag = false;          // kCheck, kDelete
  std::vector<Bytes> values;  // kMultiGet
  std::string error;          // malformed reply
};
// `expected_values` is the number of keys of a kMultiGet.
Reply parse_reply(Op op, const uint8_t* data, size_t size, size_t expected_values = 0);

// Decodes a greeting payload (without the frame header).
std::optional<Greeting> parse_greeting(const uint8_t* data, size_t size);

// Length of the frame at the front of `data` when its header is complete.
std::optional<uint32_t> frame_length(const uint8_t* data, size_t size);

// A c10d TCPStore client (torch >= 2: torchrun's agent, torch.distributed's
// TCPStore) opens with VALIDATE (u8 0) and the u32 magic 0x3C85F7CE, which
// as a frame header would announce 2.25 GB. True when the first bytes of a
// connection (at least 4) are those; the server then says in one line what
// it is instead of "bad frame".
constexpr uint8_t kTcpStoreHello[4] = {0x00, 0xCE, 0xF7, 0x85};
bool is_tcpstore_hello(const uint8_t* data, size_t size);
constexpr char kNotTcpStore[] =
    "this is a ddprun store: a c10d TCPStore client (torchrun's agent, or "
    "torch.distributed.TCPStore) connected; it speaks ddprun's own protocol, so start "
    "every node with ddprun (or give torchrun its own --rdzv-endpoint)";

}  // namespace ddprun::rendezvous::wire
