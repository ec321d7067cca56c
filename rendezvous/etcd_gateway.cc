#include "rendezvous/etcd_gateway.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <optional>
#include <thread>

#include "rendezvous/client.h"  // parse_host_port

namespace ddprun::rendezvous {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;

namespace {

// Nothing reached etcd (refused, unreachable, TLS failed, a stale
// keep-alive connection closed before the request): safe to repeat.
struct Unreached : StoreError {
  using StoreError::StoreError;
};
// etcd answered with an error: the next endpoint would answer the same.
struct Answered : StoreError {
  using StoreError::StoreError;
  bool bad_token = false;
  bool unavailable = false;  // 503: no leader yet, the gateway's own link down
};

struct Endpoint {
  std::string host;
  uint16_t port = 2379;
  bool tls = false;
};

}  // namespace

struct EtcdGateway::Impl {
  asio::io_context io;
  std::optional<ssl::context> ssl_ctx;
  std::vector<Endpoint> endpoints;
  size_t current = 0;  // the endpoint the connection goes to
  std::optional<beast::tcp_stream> tcp;
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls;
  int registered_fd = -1;  // with the canceller
  std::string token;       // the gateway's auth token, once fetched

  beast::tcp_stream& lowest() { return tls ? beast::get_lowest_layer(*tls) : *tcp; }
  bool connected() const { return tcp || tls; }

  // Runs one async operation to completion (its deadline is the stream's).
  template <class Start>
  error_code run(Start start) {
    error_code ec = asio::error::would_block;
    start([&ec](error_code e, auto&&...) { ec = e; });
    io.restart();
    io.run();
    return ec;
  }

  void close(const std::shared_ptr<Canceller>& canceller) {
    if (registered_fd >= 0 && canceller) canceller->remove(registered_fd);
    registered_fd = -1;
    tls.reset();
    tcp.reset();
  }

  void connect(const Endpoint& ep, Duration timeout, const std::shared_ptr<Canceller>& canceller,
               std::string& local_address) {
    asio::ip::tcp::resolver resolver(io);
    error_code ec;
    auto results = resolver.resolve(ep.host, std::to_string(ep.port), ec);
    if (ec) throw Unreached("cannot resolve " + ep.host + ": " + ec.message());
    if (ep.tls) tls.emplace(io, *ssl_ctx);
    else tcp.emplace(io);
    lowest().expires_after(timeout);
    ec = run([&](auto h) { lowest().async_connect(results, h); });
    if (ec) throw Unreached(ec == beast::error::timeout ? "connect timed out" : ec.message());
    if (canceller) {
      registered_fd = lowest().socket().native_handle();
      canceller->add(registered_fd);
    }
    error_code lec;
    auto local = lowest().socket().local_endpoint(lec);
    if (!lec) local_address = local.address().to_string();
    if (!tls) return;
    error_code ip_ec;
    asio::ip::make_address(ep.host, ip_ec);
    if (ip_ec) SSL_set_tlsext_host_name(tls->native_handle(), ep.host.c_str());  // SNI: names only
    tls->set_verify_mode(ssl::verify_peer);
    tls->set_verify_callback(ssl::host_name_verification(ep.host));
    ec = run([&](auto h) { tls->async_handshake(ssl::stream_base::client, h); });
    // etcd answered, and a refused certificate stays refused: no retry.
    if (ec) throw StoreError("TLS handshake: " + ec.message());
  }

  // One request on the current connection (made when there is none).
  json exchange(const Endpoint& ep, const std::string& path, const std::string& body,
                Duration timeout, const std::shared_ptr<Canceller>& canceller,
                std::string& local_address) {
    const bool reused = connected();
    if (!reused) connect(ep, timeout, canceller, local_address);
    http::request<http::string_body> req{http::verb::post, path, 11};
    req.set(http::field::host, ep.host);
    req.set(http::field::content_type, "application/json");
    if (!token.empty()) req.set(http::field::authorization, token);
    req.keep_alive(true);
    req.body() = body;
    req.prepare_payload();
    beast::flat_buffer buf;
    http::response<http::string_body> res;
    lowest().expires_after(timeout);
    error_code ec;
    if (tls) {
      ec = run([&](auto h) { http::async_write(*tls, req, h); });
      if (!ec) ec = run([&](auto h) { http::async_read(*tls, buf, res, h); });
    } else {
      ec = run([&](auto h) { http::async_write(*tcp, req, h); });
      if (!ec) ec = run([&](auto h) { http::async_read(*tcp, buf, res, h); });
    }
    if (ec) {
      // A kept-alive connection that etcd closed meanwhile (it restarted,
      // or dropped an idle client) shows as EOF or a reset before any reply
      // byte: the request never got there.
      const bool stale = reused && buf.size() == 0 &&
                         (ec == http::error::end_of_stream || ec == asio::error::connection_reset ||
                          ec == asio::error::broken_pipe || ec == asio::error::eof);
      std::string msg = ec == beast::error::timeout
                            ? "no reply within " + std::to_string(timeout.count()) + " ms"
                            : ec.message();
      if (tls) msg = "TLS connection: " + msg;  // e.g. etcd refused our certificate
      if (stale) throw Unreached(msg);
      throw StoreError(msg);
    }
    if (!res.keep_alive()) close(canceller);
    json j = json::parse(res.body(), nullptr, false);
    if (res.result() != http::status::ok || j.is_discarded()) {
      std::string msg = j.is_discarded() || !j.is_object()
                            ? res.body().substr(0, 200)
                            : j.value("message", j.value("error", res.body().substr(0, 200)));
      Answered a("HTTP " + std::to_string(res.result_int()) + ": " + msg);
      a.unavailable = res.result() == http::status::service_unavailable;
      a.bad_token = res.result() == http::status::unauthorized &&
                    msg.find("invalid auth token") != std::string::npos;
      throw a;
    }
    return j;
  }
};

EtcdGateway::EtcdGateway(EtcdOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  const std::string& list = options_.endpoints;
  bool any_tls = false;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    std::string text = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    Endpoint ep;
    std::string rest = text;
    if (rest.rfind("https://", 0) == 0) {
      ep.tls = true;
      rest = rest.substr(8);
    } else if (rest.rfind("http://", 0) == 0) {
      rest = rest.substr(7);
    }
    if (!options_.cacert.empty()) ep.tls = true;
    if (!rest.empty() && rest.back() == '/') rest.pop_back();
    if (rest.empty()) throw StoreError("etcd endpoints '" + list + "': an empty endpoint");
    const bool has_port = rest.back() != ']' && rest.find(':') != std::string::npos;
    if (!has_port) rest += ":2379";
    std::tie(ep.host, ep.port) = parse_host_port(rest, "etcd endpoint '" + text + "'");
    if (!ep.host.empty() && ep.host.front() == '[') ep.host = ep.host.substr(1, ep.host.size() - 2);
    any_tls = any_tls || ep.tls;
    impl_->endpoints.push_back(ep);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if ((!options_.cert.empty()) != (!options_.key.empty()))
    throw StoreError("etcd TLS: cert and key go together (--rdzv-conf cert=...,key=...)");
  if (!any_tls) {
    if (!options_.cert.empty()) throw StoreError("etcd TLS: cert= given but no https:// endpoint or cacert=");
    return;
  }
  impl_->ssl_ctx.emplace(ssl::context::tls_client);
  auto& ctx = *impl_->ssl_ctx;
  auto load = [&](const char* what, const std::string& file, auto fn) {
    error_code ec;
    fn(file, ec);
    if (ec) throw StoreError("etcd TLS: " + std::string(what) + " '" + file + "': " + ec.message());
  };
  if (options_.cacert.empty()) {
    ctx.set_default_verify_paths();
  } else {
    load("cacert", options_.cacert, [&](const std::string& f, error_code& ec) { ctx.load_verify_file(f, ec); });
  }
  if (!options_.cert.empty()) {
    load("cert", options_.cert,
         [&](const std::string& f, error_code& ec) { ctx.use_certificate_chain_file(f, ec); });
    load("key", options_.key,
         [&](const std::string& f, error_code& ec) { ctx.use_private_key_file(f, ssl::context::pem, ec); });
  }
}

EtcdGateway::~EtcdGateway() { impl_->close(options_.canceller); }

json EtcdGateway::post(const std::string& path, const json& body, const std::string& what) {
  auto& im = *impl_;
  const auto& canceller = options_.canceller;
  const auto retry_until = Clock::now() + retry_window_;
  const std::string text = body.dump();
  bool reauthenticated = false;
  for (;;) {
    std::string errors;
    bool reached = false;  // some endpoint got the request: no retry
    for (size_t attempt = 0; attempt < im.endpoints.size(); ++attempt) {
      if (canceller && canceller->cancelled()) throw CancelledError("etcd " + what + ": cancelled");
      const Endpoint& ep = im.endpoints[im.current];
      const std::string where = ep.host + ":" + std::to_string(ep.port);
      try {
        if (!options_.user.empty() && im.token.empty()) {
          json auth = {{"name", options_.user}, {"password", options_.password}};
          try {
            json r = im.exchange(ep, "/v3/auth/authenticate", auth.dump(), options_.request_timeout,
                                 canceller, local_address_);
            im.token = r.value("token", "");
          } catch (const Answered& e) {
            Answered a("authenticating as '" + options_.user + "': " + e.what());
            a.unavailable = e.unavailable;
            throw a;
          }
        }
        return im.exchange(ep, path, text, options_.request_timeout, canceller, local_address_);
      } catch (const Answered& e) {
        if (e.bad_token && !reauthenticated) {  // expired (etcd's simple tokens live minutes)
          reauthenticated = true;
          im.token.clear();
          --attempt;
          continue;
        }
        if (!e.unavailable) throw StoreError("etcd " + what + " at " + where + ": " + e.what());
        // etcd coming up (or electing a leader) refuses before it acts:
        // like an endpoint that is not up yet.
        errors += (errors.empty() ? "" : "; ") + where + ": " + e.what();
      } catch (const Unreached& e) {
        errors += (errors.empty() ? "" : "; ") + where + ": " + e.what();
      } catch (const StoreError& e) {
        reached = true;
        errors += (errors.empty() ? "" : "; ") + where + ": " + e.what();
      } catch (const std::exception& e) {
        reached = true;
        errors += (errors.empty() ? "" : "; ") + where + ": " + e.what();
      }
      im.close(canceller);
      im.token.clear();  // a token is per member: fetch it again there
      im.current = (im.current + 1) % im.endpoints.size();
    }
    if (canceller && canceller->cancelled()) throw CancelledError("etcd " + what + ": cancelled");
    const auto now = Clock::now();
    if (reached || now >= retry_until)
      throw StoreError("etcd " + what + " failed at every endpoint (" + errors + ")");
    // etcd is down or restarting: try again shortly, within the window.
    std::this_thread::sleep_for(std::min<Duration>(
        Duration(100), std::chrono::duration_cast<Duration>(retry_until - now) + Duration(1)));
  }
}

}  // namespace ddprun::rendezvous
