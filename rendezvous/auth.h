// HMAC-SHA256 challenge-response for the store (OpenSSL libcrypto).
//
// The server sends a random nonce in its greeting; a client proves it knows
// the shared token by answering HMAC-SHA256(token, kAuthLabel || nonce).
// The token itself never crosses the wire and is never logged.
#pragma once

#include <string>

#include "rendezvous/wire.h"

namespace ddprun::rendezvous {

// Cryptographically random bytes; throws StoreError if the RNG fails.
wire::Bytes random_nonce();
wire::Bytes auth_mac(const std::string& token, const wire::Bytes& nonce);
// Constant-time comparison of `mac` with the expected one.
bool auth_verify(const std::string& token, const wire::Bytes& nonce, const wire::Bytes& mac);

}  // namespace ddprun::rendezvous
