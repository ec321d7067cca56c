// The TCP store client: one connection, a deadline on every call.
//
// Connects (retrying while the server is not up yet, until connect_timeout),
// and with a token runs the mutual HMAC handshake: it refuses a store that
// does not ask for the token or cannot prove it knows it. Reconnects
// when it finds the connection closed (e.g. after a server restart on the
// same port). A request whose reply was lost is retried on a fresh
// connection only when repeating it is harmless (set, get, wait, check,
// multi-get, multi-set, num_keys, ping); add/append/compare-set/delete throw
// StoreError instead, since the server may have applied them.
// Thread-compatible: give each thread its own Client.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "rendezvous/canceller.h"
#include "rendezvous/hash_store.h"
#include "rendezvous/prefix_store.h"
#include "rendezvous/store.h"
#include "rendezvous/wire.h"

struct addrinfo;  // <netdb.h>

namespace ddprun::rendezvous {

struct ClientOptions {
  // Store host name or address.
  std::string host;
  // Store TCP port.
  uint16_t port = 0;
  // Shared secret for the HMAC challenge; empty = no auth.
  std::string token;
  // How long to keep trying to connect (refused or unreachable) and finish
  // the handshake; without a token, also how long a first call keeps
  // trying while the store closes its connections before the greeting.
  Duration connect_timeout{30000};
  // Deadline of every non-blocking call (set, add, ...).
  Duration op_timeout{300000};
  // Blocking calls (get, wait, multi_get) give the server this much beyond
  // their own timeout to answer before the client gives up on it.
  Duration reply_grace{2000};
  // When set, Canceller::cancel() from another thread ends a blocked call
  // at once (CancelledError), and every later call too.
  std::shared_ptr<Canceller> canceller;
};

class Client : public Store {
 public:
  // Connects at once; throws StoreError (refused token, bad greeting) or
  // TimeoutError (nothing answered within connect_timeout). Without a token
  // it does not wait for the store's greeting: the first call's request
  // goes out at once, and that call reports a store that wants a token, is
  // no ddprun store, or refuses every connection (connection limits).
  explicit Client(ClientOptions options);
  ~Client() override;
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Duration timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool remove(const std::string& key) override;
  int64_t num_keys() override;
  void append(const std::string& key, const Bytes& value) override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys, Duration timeout) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  void ping() override;
  // Kept by the server for this connection only: a reconnect drops it, and
  // the broken connection that caused the reconnect has already fired it.
  bool set_on_close(const std::vector<std::string>& keys, const std::vector<Bytes>& values,
                    const std::string& counter) override;

  // Sets both op_timeout and reply_grace to `window`.
  void set_reply_window(Duration window) override {
    options_.op_timeout = window;
    options_.reply_grace = window;
  }

  // "host:port", as errors name it.
  const std::string& address() const { return address_; }
  // Local address of the connection ("10.0.0.2"): the address other hosts
  // can reach this one at, even on multi-NIC hosts.
  std::string local_address() const;

 private:
  using Clock = std::chrono::steady_clock;
  // Milliseconds to `deadline` for poll(), rounded up (0 once passed).
  static int ms_left(Clock::time_point deadline);
  // Connects and authenticates, retrying with back-off (the server may
  // still be starting) until options_.connect_timeout or `cap`, whichever
  // comes first: a reconnect inside a call ends by the call's deadline.
  void connect(Clock::time_point cap = Clock::time_point::max());
  // One pass over the host's addresses; true with fd_ connected. On
  // failure `last_error` says why.
  bool open_connection(Clock::time_point deadline, std::string& last_error);
  // A connected blocking socket to `ai`, or -1.
  int connect_to(const addrinfo& ai, Clock::time_point deadline, std::string& last_error);
  // Reads the greeting and authenticates by `deadline` (this attempt's);
  // false (disconnected) when the server closed the connection or the
  // attempt's window passed before `overall`: worth another try.
  bool handshake(Clock::time_point deadline, Clock::time_point overall, std::string& last_error);
  // The first connect attempt's window, doubled per attempt up to the max.
  static constexpr Duration kFirstAttemptWindow{2000};
  static constexpr Duration kMaxAttemptWindow{30000};
  // The mutual HMAC handshake (auth.h); throws StoreError on any mismatch.
  void authenticate(const wire::Greeting& greeting, Clock::time_point deadline);
  void disconnect();
  void close_fd(int fd);
  void throw_if_cancelled(const std::string& what) const;
  // One round trip; returns the decoded reply, kOk or kTimeout. Throws
  // StoreError on kError or a malformed reply.
  wire::Reply call(const wire::Request& request, bool retry_safe, const std::string& what);
  void send_all(const Bytes& frame, Clock::time_point deadline, const std::string& what);
  Bytes read_frame(Clock::time_point deadline, const std::string& what);
  // Sets the socket timeouts so no send/recv outlives `deadline`; false
  // when it has passed.
  bool arm(Clock::time_point deadline);
  void read_acks(Clock::time_point deadline, std::string& error);
  // Without a token the greeting is not awaited at connect: it is read and
  // checked in front of the first reply (read_reply). An EOF before it is
  // RefusedBeforeGreeting (client.cc).
  void read_greeting(Clock::time_point deadline);
  Bytes read_reply(Clock::time_point deadline, const std::string& what);
  // After a refusal before the greeting: waits as connect() does between
  // attempts, or throws once connect_timeout (or `deadline`) has passed
  // since the first refusal in a row.
  void back_off_after_refusal(const std::string& why, Clock::time_point deadline);
  void reconnect(Clock::time_point deadline);
  [[noreturn]] void no_answer(const std::string& what, Duration waited);
  [[noreturn]] void timeout(const std::string& what, Duration after);

  ClientOptions options_;
  std::string address_;
  // Sets sent but not yet acknowledged, oldest first (at most kMaxUnacked).
  struct Unacked {
    std::string key;
    Bytes frame;
  };
  static constexpr size_t kMaxUnacked = 64;
  std::deque<Unacked> unacked_;
  int fd_ = -1;
  bool greeted_ = true;  // fd_'s greeting has been read (false: read with the first reply)
  bool was_connected_ = false;  // a connection was made once: a refusal now means gone
  bool all_refused_ = false;   // every address of the last attempt refused (ECONNREFUSED)
  Clock::time_point refused_since_{};  // first of the refusals in a row, if any
  std::chrono::milliseconds refusal_backoff_{10};
  int armed_ms_ = 0;  // current SO_RCVTIMEO/SO_SNDTIMEO; 0 = not set
  Bytes rbuf_;
  size_t rpos_ = 0;
};

// Worker side: connects to DDPRUN_STORE_ADDR (host:port) with
// DDPRUN_RDZV_TOKEN, scoped to DDPRUN_STORE_PREFIX (docs/CONTRACTS.md).
// Returns nullptr when DDPRUN_STORE_ADDR is unset; throws StoreError naming
// the variable when its value is malformed or the token is set but empty.
// The token's old name DDPRUN_STORE_TOKEN is still read, with a warning.
std::unique_ptr<Store> connect_from_env(Duration connect_timeout = Duration(30000));

// The store token from the environment: DDPRUN_RDZV_TOKEN, else the old
// name DDPRUN_STORE_TOKEN (with a warning). Empty when neither is set;
// throws StoreError naming the variable when one is set but empty.
std::string token_from_env();

// Splits "host:port" or "[v6]:port"; throws StoreError naming `what`.
std::pair<std::string, uint16_t> parse_host_port(const std::string& text, const std::string& what);
// The reverse: "host:port", an IPv6 host in brackets.
std::string format_host_port(const std::string& host, uint16_t port);

}  // namespace ddprun::rendezvous
