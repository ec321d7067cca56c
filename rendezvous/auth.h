// HMAC-SHA256 challenge-response for the store (OpenSSL libcrypto).
//
// Mutual: the server sends a random nonce in its greeting; the client
// answers HMAC-SHA256(token, kClientAuthLabel || server_nonce || client_nonce)
// with a nonce of its own, and the server proves it knows the token too by
// answering HMAC-SHA256(token, kServerAuthLabel || client_nonce ||
// server_nonce). So neither an intruder nor an impostor store on the port
// gets past the handshake. It authenticates the two ends, not the bytes after
// it: there is no encryption (run the store on a network you trust). The
// token itself never crosses the wire and is never logged.
#pragma once

#include <string>

#include "rendezvous/wire.h"

namespace ddprun::rendezvous {

// Cryptographically random bytes; throws StoreError if the RNG fails.
wire::Bytes random_nonce();
// HMAC-SHA256(token, label || first || second).
wire::Bytes auth_mac(const std::string& token, const char* label, const wire::Bytes& first,
                     const wire::Bytes& second);
// Constant-time comparison of `mac` with the expected one.
bool auth_verify(const std::string& token, const char* label, const wire::Bytes& first,
                 const wire::Bytes& second, const wire::Bytes& mac);

}  // namespace ddprun::rendezvous
