// The worker side of docs/CONTRACTS.md: DDPRUN_STORE_* to a store.
#include <spdlog/spdlog.h>

#include <cstdlib>

#include "base/contract.h"
#include "rendezvous/client.h"

namespace ddprun::rendezvous {

std::pair<std::string, uint16_t> parse_host_port(const std::string& text, const std::string& what) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    throw StoreError(what + "='" + text + "' is not host:port");
  }
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  std::string port = text.substr(colon + 1);
  char* end = nullptr;
  long p = std::strtol(port.c_str(), &end, 10);
  if (*end != '\0' || p <= 0 || p > 65535) {
    throw StoreError(what + "='" + text + "': port '" + port + "' is not in 1..65535");
  }
  return {host, static_cast<uint16_t>(p)};
}

std::string format_host_port(const std::string& host, uint16_t port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string token_from_env() {
  const char* name = base::kEnvRdzvToken;
  const char* token = std::getenv(name);
  if (token == nullptr) {
    name = base::kEnvOldStoreToken;
    token = std::getenv(name);
    if (token == nullptr) return "";
    spdlog::warn("{} is the old name of {}; set {}", name, base::kEnvRdzvToken, base::kEnvRdzvToken);
  }
  // An empty secret would silently turn authentication off.
  if (*token == '\0') {
    throw StoreError(std::string(name) + " is set but empty: give the shared secret or unset it");
  }
  return token;
}

std::unique_ptr<Store> connect_from_env(Duration connect_timeout) {
  const char* addr = std::getenv(base::kEnvStoreAddr);
  if (addr == nullptr || *addr == '\0') return nullptr;
  ClientOptions o;
  std::tie(o.host, o.port) = parse_host_port(addr, base::kEnvStoreAddr);
  o.token = token_from_env();
  o.connect_timeout = connect_timeout;
  auto client = std::make_unique<Client>(std::move(o));
  const char* prefix = std::getenv(base::kEnvStorePrefix);
  if (prefix == nullptr || *prefix == '\0') return client;
  return std::make_unique<PrefixStore>(prefix, std::move(client));
}

}  // namespace ddprun::rendezvous
