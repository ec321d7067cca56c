// HMAC-SHA256 (RFC 2104) over libcrypto's low-level SHA-256, and nonces
// from getrandom(2). The EVP/RAND front ends of OpenSSL 3 load its provider
// machinery on first use, which costs every process (the agent, each worker
// that connects) about 2.4 MiB of RSS; SHA256_* and the kernel's CSPRNG do
// the same job for about 0.3 MiB.
#define OPENSSL_SUPPRESS_DEPRECATED  // SHA256_Init & co.: deprecated, not removed
#include "rendezvous/auth.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <sys/random.h>

#include <cstring>

#include "base/system_error.h"
#include "rendezvous/store.h"

namespace ddprun::rendezvous {

wire::Bytes random_nonce() {
  wire::Bytes nonce(wire::kNonceSize);
  size_t got = 0;
  while (got < nonce.size()) {
    ssize_t n = getrandom(nonce.data() + got, nonce.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw StoreError(std::string("store auth: getrandom failed: ") + base::errno_text(errno));
    got += static_cast<size_t>(n);
  }
  return nonce;
}

wire::Bytes auth_mac(const std::string& token, const char* label, const wire::Bytes& first,
                     const wire::Bytes& second) {
  constexpr size_t kBlock = SHA256_CBLOCK;  // 64
  unsigned char key[kBlock] = {};
  if (token.size() > kBlock) {
    SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), key);
  } else {
    std::memcpy(key, token.data(), token.size());
  }
  unsigned char pad[kBlock];
  unsigned char inner[SHA256_DIGEST_LENGTH];
  SHA256_CTX ctx;
  for (size_t i = 0; i < kBlock; ++i) pad[i] = key[i] ^ 0x36;
  SHA256_Init(&ctx);
  SHA256_Update(&ctx, pad, kBlock);
  SHA256_Update(&ctx, label, std::strlen(label));
  SHA256_Update(&ctx, first.data(), first.size());
  SHA256_Update(&ctx, second.data(), second.size());
  SHA256_Final(inner, &ctx);
  for (size_t i = 0; i < kBlock; ++i) pad[i] = key[i] ^ 0x5c;
  wire::Bytes mac(SHA256_DIGEST_LENGTH);
  SHA256_Init(&ctx);
  SHA256_Update(&ctx, pad, kBlock);
  SHA256_Update(&ctx, inner, sizeof inner);
  SHA256_Final(mac.data(), &ctx);
  OPENSSL_cleanse(key, sizeof key);
  OPENSSL_cleanse(pad, sizeof pad);
  return mac;
}

bool auth_verify(const std::string& token, const char* label, const wire::Bytes& first,
                 const wire::Bytes& second, const wire::Bytes& mac) {
  wire::Bytes expected = auth_mac(token, label, first, second);
  return mac.size() == expected.size() &&
         CRYPTO_memcmp(mac.data(), expected.data(), mac.size()) == 0;
}

}  // namespace ddprun::rendezvous
