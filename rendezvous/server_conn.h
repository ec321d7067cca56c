// The store server's state and its connections, shared by server.cc (the
// server, admission of connections) and server_conn.cc (a connection's
// requests, replies and buffers). Private to those two files.
// Single-threaded: the server's event loop runs all of it.
#pragma once

#include <boost/asio/steady_timer.hpp>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>

#include "rendezvous/server.h"
#include "rendezvous/server_io.h"
#include "rendezvous/server_limits.h"
#include "rendezvous/table.h"

namespace ddprun::rendezvous {

struct Conn;

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  Impl(boost::asio::io_context& io, ServerOptions o)
      : io(io), options(std::move(o)), acceptor(io), accept_retry(io),
        table(options.max_store_bytes), log(io.get_executor()) {}
  // Serves a new connection, or refuses it when a connection limit is reached.
  void admit(boost::asio::ip::tcp::socket s);
  // `peer` is "addr:port" for log lines, `peer_addr` the key of its slots.
  void serve(boost::asio::ip::tcp::socket s, const std::string& peer_addr,
             const std::string& peer);
  // Closes the connections holding the most until the buffered bytes fit
  // max_buffered_bytes again.
  void enforce_buffer_limit();
  // What max_buffered_bytes bounds: the connections' buffers and the
  // table's blocked requests.
  size_t used() const { return buffered + table.waiting_bytes(); }

  boost::asio::io_context& io;
  ServerOptions options;
  boost::asio::ip::tcp::acceptor acceptor;
  boost::asio::steady_timer accept_retry;  // after EMFILE, wait before accepting again
  Table table;
  std::list<std::shared_ptr<Conn>> conns;
  PeerSlots slots;
  // Unauthenticated connections by address, oldest first, and the subnet
  // of each address (eviction picks from these).
  struct PreAuth {
    std::string subnet;
    std::list<Conn*> conns;
  };
  std::unordered_map<std::string, PreAuth> pre_auth;
  void listed(Conn& c);
  void unlisted(Conn& c);
  // With every unauthenticated slot taken: closes the oldest of the
  // address holding the most in the subnet holding the most, when that
  // address holds more than `addr`; false when none does. With `subnet`
  // (its share taken), only addresses of that subnet are candidates, so
  // that an attacker sharing a good client's /24 cannot lock it out.
  bool evict_for(const std::string& addr, const std::string& subnet = "");
  RateLimitedLog log;
  wire::Bytes scratch;  // read target of every connection
  size_t buffered = 0;  // sum of Conn::charged
  bool closed = false;
  // A TCPStore client retries its connection several times a second: the
  // line that says why they are closed is logged once per server.
  bool tcpstore_noted = false;
};

struct Conn : std::enable_shared_from_this<Conn> {
  Conn(std::shared_ptr<Server::Impl> srv, boost::asio::ip::tcp::socket s)
      : srv(std::move(srv)), sock(std::move(s)), wait_timer(sock.get_executor()),
        frame_timer(sock.get_executor()), handshake_timer(sock.get_executor()),
        write_timer(sock.get_executor()) {}

  void start();
  void read_more();
  bool read_paused() const { return closed || closing; }
  // How many more bytes this connection may buffer now (0: do not read).
  size_t read_allowance() const;
  void process();
  void handle(wire::Request request);
  void authenticate(const wire::Request& request);
  void flush();
  // Sends `shared` from shared_sent on, then resumes.
  void flush_shared();
  // Sends `rest` (in `sending` or `shared`) in the background.
  void write_async(boost::asio::const_buffer rest);
  void close();
  // Logs why, then closes.
  void fail(const std::string& why);
  // Answers the blocked request: `answer`, or a timeout when null.
  void finish_wait(const Table::Answer& answer);
  // Charges this connection's buffers to the server-wide limit.
  void account();

  std::shared_ptr<Server::Impl> srv;
  boost::asio::ip::tcp::socket sock;
  std::string peer;       // "addr:port", for log lines
  std::string peer_addr;  // "addr", the key of its slot counts
  std::list<std::shared_ptr<Conn>>::iterator self_it;
  std::list<Conn*>::iterator pre_auth_it;  // in srv->pre_auth, while not authed
  bool pre_auth_listed = false;
  wire::Bytes in;  // received, not yet parsed from in_pos on
  size_t in_pos = 0;
  PeekAhead ahead;  // the wait for input's own peek (server_io.h)
  wire::Bytes out, sending;
  // A blocked request's answer, shared by every waiter of the same keys
  // (Table::Answer) and sent from there, before `out`: an all-gather's N
  // answers are one buffer, not N copies.
  Table::Answer shared;
  size_t shared_sent = 0;
  bool reading = false, writing = false;
  bool closing = false;  // close once the output is flushed
  bool closed = false;
  bool authed = false;
  bool framed = false;  // a first frame header has arrived (is_tcpstore_hello)
  // The greeting waits in `out` for the reply to the request that came with
  // the connection (start()); close() sends it if nothing else did.
  bool greeting_held = false;
  wire::Bytes nonce;
  // kOnClose writes to run when the client goes away (wire.h).
  std::unique_ptr<wire::Request> on_close;
  // The blocked request, if any; later requests wait behind it.
  std::unique_ptr<wire::Request> pending;
  size_t pending_bytes = 0;
  size_t on_close_bytes = 0;  // what `on_close` holds, charged like a blocked request
  size_t charged = 0;  // bytes counted in srv->buffered
  Table::Waiter waiter;
  uint64_t wait_gen = 0;
  boost::asio::steady_timer wait_timer, frame_timer, handshake_timer, write_timer;
  bool frame_timer_armed = false;
  bool resume_posted = false;  // process() yielded with requests left to parse
};

}  // namespace ddprun::rendezvous
