#include "rendezvous/server.h"

#include "rendezvous/server_conn.h"
#include "rendezvous/store.h"

namespace ddprun::rendezvous {

namespace asio = boost::asio;
using asio::ip::tcp;

void Server::Impl::enforce_buffer_limit() {
  // A connection holds its own buffers and its share of the wait it blocks
  // in: waiters of one all-gather split its cost, a lone wait pays it all.
  auto held = [this](const Conn& c) { return c.charged + table.share(c.waiter); };
  while (used() > options.max_buffered_bytes) {
    Conn* biggest = nullptr;
    for (const auto& c : conns) {
      if (!biggest || held(*c) > held(*biggest)) biggest = c.get();
    }
    if (biggest == nullptr || held(*biggest) == 0) return;
    log.warn("store: closing " + biggest->peer + ": it holds " + std::to_string(held(*biggest)) +
             " of the " + std::to_string(used()) + " bytes buffered, over the limit of " +
             std::to_string(options.max_buffered_bytes));
    biggest->close();
  }
}

void Server::Impl::serve(tcp::socket s, const std::string& addr, const std::string& peer) {
  auto c = std::make_shared<Conn>(shared_from_this(), std::move(s));
  c->peer_addr = addr;
  c->peer = peer;
  c->authed = options.token.empty();
  slots.add(addr, c->authed);
  c->self_it = conns.insert(conns.end(), c);
  if (!c->authed) listed(*c);
  c->start();
}

void Server::Impl::listed(Conn& c) {
  auto& p = pre_auth[c.peer_addr];
  if (p.conns.empty()) p.subnet = subnet_of(c.peer_addr);
  c.pre_auth_it = p.conns.insert(p.conns.end(), &c);
  c.pre_auth_listed = true;
}

void Server::Impl::unlisted(Conn& c) {
  if (!c.pre_auth_listed) return;
  c.pre_auth_listed = false;
  auto it = pre_auth.find(c.peer_addr);
  it->second.conns.erase(c.pre_auth_it);
  if (it->second.conns.empty()) pre_auth.erase(it);
}

bool Server::Impl::evict_for(const std::string& addr, const std::string& subnet) {
  // O(addresses holding unauthenticated slots): at most max_unauthenticated.
  const PreAuth* victim = nullptr;
  size_t victim_subnet = 0;
  for (const auto& [a, p] : pre_auth) {
    if (!subnet.empty() && p.subnet != subnet) continue;
    size_t in_subnet = slots.unauthenticated_in(p.subnet);
    if (!victim || in_subnet > victim_subnet ||
        (in_subnet == victim_subnet && p.conns.size() > victim->conns.size())) {
      victim = &p;
      victim_subnet = in_subnet;
    }
  }
  if (!victim || victim->conns.size() <= slots.of(addr).unauthenticated) return false;
  Conn* oldest = victim->conns.front();
  log.warn("store: closing " + oldest->peer + ", not authenticated yet, to make room for " + addr +
           (subnet.empty() ? ": every unauthenticated slot is taken"
                           : ": the unauthenticated slots of subnet " + subnet + " are taken") +
           " and its address holds " +
           std::to_string(victim->conns.size()));
  oldest->close();
  return true;
}

void Server::Impl::admit(tcp::socket s) {
  boost::system::error_code ignored, ep_ec;
  auto ep = s.remote_endpoint(ep_ec);  // once: serve() takes the port from here
  std::string addr = ep_ec ? "unknown peer" : ep.address().to_string();
  const auto& o = options;
  const auto& peer = slots.of(addr);
  const bool auth = !o.token.empty();
  std::string refusal;
  if (conns.size() >= o.max_connections) {
    refusal = std::to_string(o.max_connections) + " connections is the limit";
  } else if (peer.connections >= o.max_connections_per_peer) {
    refusal = std::to_string(o.max_connections_per_peer) + " connections from one address is the limit";
  } else if (auth && peer.unauthenticated >= o.max_unauthenticated_per_peer) {
    refusal = std::to_string(o.max_unauthenticated_per_peer) +
              " unauthenticated connections from one address is the limit";
  } else if (auth && slots.unauthenticated_in(subnet_of(addr)) >= o.max_unauthenticated_per_subnet &&
             !evict_for(addr, subnet_of(addr))) {
    refusal = std::to_string(o.max_unauthenticated_per_subnet) +
              " unauthenticated connections from one subnet is the limit";
  } else if (auth && slots.unauthenticated() >= o.max_unauthenticated && !evict_for(addr)) {
    refusal = std::to_string(o.max_unauthenticated) + " unauthenticated connections is the limit";
  }
  if (!refusal.empty()) {
    log.warn("store: refusing a connection from " + addr + ": " + refusal);
    s.close(ignored);
  } else {
    serve(std::move(s), addr, ep_ec ? addr : addr + ":" + std::to_string(ep.port()));
  }
}

Server::Server(asio::io_context& io, ServerOptions options)
    : impl_(std::make_shared<Impl>(io, std::move(options))) {
  const auto& o = impl_->options;
  std::string where = o.host + ":" + std::to_string(o.port);
  try {
    listen_on(impl_->acceptor, o.host, o.port, o.backlog);
  } catch (const boost::system::system_error& e) {
    throw StoreError("store server: cannot listen on " + where + ": " + e.code().message());
  }
  accept_connections(impl_, "store");
}

Server::~Server() { close(); }

tcp::endpoint Server::endpoint() const {
  boost::system::error_code ec;
  return impl_->acceptor.local_endpoint(ec);
}

void Server::close() { shut_down_server(*impl_); }

void Server::preload(const std::string& key, wire::Bytes value) {
  if (impl_->table.set(key, std::move(value)) != Table::Write::kOk)
    throw StoreError("store server: cannot preload " + quoted_key(key) + " (the table refuses it)");
}

void Server::adopt(int fd, const std::string& peer) {
  tcp::socket s(impl_->io);
  boost::system::error_code ec;
  s.assign(tcp::v4(), fd, ec);
  if (ec) throw StoreError("store server: cannot adopt descriptor: " + ec.message());
  impl_->serve(std::move(s), peer, peer);
}

size_t Server::num_connections() const { return impl_->conns.size(); }
size_t Server::num_keys() const { return impl_->table.num_keys(); }
size_t Server::num_waiters() const { return impl_->table.num_waiters(); }
size_t Server::buffered_bytes() const { return impl_->used(); }

}  // namespace ddprun::rendezvous
