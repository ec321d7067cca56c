// Mutual authentication and where the token comes from: an impostor store
// or one that asks for no token is refused by a client holding a token; one
// variable name (DDPRUN_RDZV_TOKEN) everywhere; an empty token is refused.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <spdlog/spdlog.h>

#include <sstream>

#include "rendezvous/auth.h"
#include "tests/rendezvous/store_process.h"
#include "tests/rendezvous/test_util.h"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::testing;

namespace {

// A listener that greets like a store asking for a token, reads the
// client's answer, and claims success with a proof it cannot compute (it
// does not know the token): what an impostor on the store's port can do.
class ImpostorStore {
 public:
  ImpostorStore() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(fd_, 4) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      throw std::runtime_error("impostor: cannot listen");
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve_one(); });
  }
  ~ImpostorStore() {
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  uint16_t port() const { return port_; }
  bool got_auth() const { return got_auth_; }

 private:
  void serve_one() {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 10000) != 1) return;
    int c = ::accept(fd_, nullptr, nullptr);
    if (c < 0) return;
    wire::Greeting g{true, random_nonce()};
    wire::Bytes out = wire::encode_greeting(g);
    ::send(c, out.data(), out.size(), MSG_NOSIGNAL);
    wire::Bytes in;
    uint8_t buf[512];
    while (true) {  // one auth frame, within the deadline
      pollfd q{c, POLLIN, 0};
      if (::poll(&q, 1, 10000) != 1) break;
      ssize_t n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0) break;
      in.insert(in.end(), buf, buf + n);
      auto r = wire::parse_request(in.data(), in.size());
      if (r.kind == wire::ParseResult::kNeedMore) continue;
      got_auth_ = r.kind == wire::ParseResult::kOk && r.request.op == wire::Op::kAuth;
      wire::Bytes reply;
      {
        wire::Writer w(reply);
        w.u8(static_cast<uint8_t>(wire::Status::kOk));
        w.str(random_nonce());  // 32 bytes that are not the proof
      }
      ::send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
      break;
    }
    ::close(c);
  }
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> got_auth_{false};
  std::thread thread_;
};

ClientOptions to(uint16_t port, const std::string& token) {
  ClientOptions c;
  c.host = "127.0.0.1";
  c.port = port;
  c.token = token;
  c.connect_timeout = 5s;
  return c;
}

}  // namespace

TEST_CASE("a store that cannot prove it knows the token is refused as an impostor") {
  ImpostorStore impostor;
  CHECK_THROWS_WITH_AS(Client(to(impostor.port(), "s3cret")),
                       doctest::Contains("failed to prove it knows the token"), StoreError);
  CHECK(impostor.got_auth());
}

TEST_CASE("a client holding a token refuses a store that asks for none") {
  ServerThread server;  // no token
  CHECK_THROWS_WITH_AS(Client(to(server.port(), "s3cret")),
                       doctest::Contains("asks for no token, but this node holds one"), StoreError);
  Client(to(server.port(), "")).ping();  // token-less clients still work
}

TEST_CASE("the store proves the token to the client and the client to the store") {
  ServerOptions o;
  o.token = "s3cret";
  ServerThread server(o);
  Client c(to(server.port(), "s3cret"));
  c.set("k", B("v"));
  CHECK(c.get("k", 1s) == B("v"));
  CHECK_THROWS_WITH_AS(Client(to(server.port(), "other")), doctest::Contains("refused the token"),
                       StoreError);
}

TEST_CASE("the token is read from DDPRUN_RDZV_TOKEN; the old name warns; empty is refused") {
  unsetenv("DDPRUN_RDZV_TOKEN");
  unsetenv("DDPRUN_STORE_TOKEN");
  CHECK(token_from_env().empty());
  setenv("DDPRUN_RDZV_TOKEN", "new", 1);
  setenv("DDPRUN_STORE_TOKEN", "old", 1);
  CHECK(token_from_env() == "new");
  unsetenv("DDPRUN_RDZV_TOKEN");
  {
    LogCapture log;
    CHECK(token_from_env() == "old");
    CHECK(log.str().find("DDPRUN_STORE_TOKEN is the old name of DDPRUN_RDZV_TOKEN") !=
          std::string::npos);
  }
  setenv("DDPRUN_STORE_TOKEN", "", 1);
  CHECK_THROWS_WITH_AS(token_from_env(), doctest::Contains("DDPRUN_STORE_TOKEN is set but empty"),
                       StoreError);
  unsetenv("DDPRUN_STORE_TOKEN");
  setenv("DDPRUN_RDZV_TOKEN", "", 1);
  CHECK_THROWS_WITH_AS(token_from_env(), doctest::Contains("DDPRUN_RDZV_TOKEN is set but empty"),
                       StoreError);
  unsetenv("DDPRUN_RDZV_TOKEN");
}

TEST_CASE("ddprun-store takes its token from DDPRUN_RDZV_TOKEN") {
  StoreProcess store(STORE_BIN, {}, {"DDPRUN_RDZV_TOKEN=from-env", "DDPRUN_STORE_TOKEN"});
  auto port = store.port();
  REQUIRE(port);
  CHECK(store.log().find("auth on") != std::string::npos);
  // Without a token the greeting is read with the first reply.
  CHECK_THROWS_WITH_AS(Client(to(*port, "")).ping(), doctest::Contains("requires a token"), StoreError);
  Client c(to(*port, "from-env"));
  c.ping();
  CHECK(store.log().find("from-env") == std::string::npos);  // never logged
  CHECK(store.stop() == 0);
}

TEST_CASE("ddprun-store still reads DDPRUN_STORE_TOKEN, with a warning") {
  StoreProcess store(STORE_BIN, {}, {"DDPRUN_RDZV_TOKEN", "DDPRUN_STORE_TOKEN=old-name"});
  auto port = store.port();
  REQUIRE(port);
  CHECK(store.log().find("DDPRUN_STORE_TOKEN is the old name") != std::string::npos);
  Client(to(*port, "old-name")).ping();
  CHECK(store.stop() == 0);
}

TEST_CASE("ddprun-store refuses an empty token from any source with exit status 2") {
  ddprun::testing::TempDir dir;
  { std::ofstream(dir.file("empty")) << "\n"; }
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> cases = {
      {{}, {"DDPRUN_RDZV_TOKEN=", "DDPRUN_STORE_TOKEN"}},
      {{}, {"DDPRUN_RDZV_TOKEN", "DDPRUN_STORE_TOKEN="}},
      {{"--token-file", dir.file("empty")}, {"DDPRUN_RDZV_TOKEN", "DDPRUN_STORE_TOKEN"}},
  };
  for (const auto& [args, env] : cases) {
    StoreProcess store(STORE_BIN, args, env);
    CHECK(store.wait_exit(10s) == 2);
    std::string log = store.log();
    CHECK(log.find("empty") != std::string::npos);
    CHECK(log.find("listening") == std::string::npos);
  }
}

TEST_CASE("ddprun-store warns once about a --token-file others can read, and not about a private one") {
  ddprun::testing::TempDir dir;
  { std::ofstream(dir.file("open")) << "s3cret\n"; }
  { std::ofstream(dir.file("private")) << "s3cret\n"; }
  REQUIRE(::chmod(dir.file("open").c_str(), 0644) == 0);
  REQUIRE(::chmod(dir.file("private").c_str(), 0600) == 0);
  for (const char* name : {"open", "private"}) {
    StoreProcess store(STORE_BIN, {"--token-file", dir.file(name)}, {"DDPRUN_RDZV_TOKEN", "DDPRUN_STORE_TOKEN"});
    auto port = store.port();
    REQUIRE(port);
    Client(to(*port, "s3cret")).ping();
    const std::string log = store.log();
    const bool warned = log.find("is readable by every user (mode 0644): chmod 600 it") != std::string::npos;
    CHECK(warned == (std::string(name) == "open"));
    CHECK(log.find("s3cret") == std::string::npos);  // the secret itself is never logged
    CHECK(store.stop() == 0);
  }
}
