#include "rendezvous/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "rendezvous/store.h"

namespace ddprun::rendezvous {

wire::Bytes random_nonce() {
  wire::Bytes nonce(wire::kNonceSize);
  if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1) {
    throw StoreError("store auth: OpenSSL RAND_bytes failed");
  }
  return nonce;
}

wire::Bytes auth_mac(const std::string& token, const wire::Bytes& nonce) {
  wire::Bytes message(wire::kAuthLabel, wire::kAuthLabel + sizeof(wire::kAuthLabel) - 1);
  message.insert(message.end(), nonce.begin(), nonce.end());
  wire::Bytes mac(EVP_MAX_MD_SIZE);
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), message.data(),
           message.size(), mac.data(), &len) == nullptr) {
    throw StoreError("store auth: OpenSSL HMAC-SHA256 failed");
  }
  mac.resize(len);
  return mac;
}

bool auth_verify(const std::string& token, const wire::Bytes& nonce, const wire::Bytes& mac) {
  wire::Bytes expected = auth_mac(token, nonce);
  return mac.size() == expected.size() &&
         CRYPTO_memcmp(mac.data(), expected.data(), mac.size()) == 0;
}

}  // namespace ddprun::rendezvous
