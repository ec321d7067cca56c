// Liveness: whether an object that handed `this` to an asynchronous
// callback (an Asio completion handler, a post() from another thread, a
// peer's notification) still exists when that callback runs. Asio delivers
// operation_aborted after a socket is closed or a timer destroyed, and
// posted work runs later still, so such a handler must not touch `this`
// unless the owner's token says it lives.
//
// The owner keeps a Liveness member and captures token() in each handler;
// the handler returns at once when the token is false. The flag clears when
// the Liveness is destroyed, or earlier with revoke() for an owner whose
// destructor tears other members down first (closing a socket, joining a
// thread) while handlers may still be called.
//
// Not thread-safe: a token is read, and the Liveness revoked or destroyed,
// on one thread (the owner's io_context). Handlers that start elsewhere
// post to that loop before they read the token.
#pragma once

#include <memory>
#include <utility>

namespace ddprun::base {

class Liveness {
 public:
  class Token {
   public:
    bool alive() const { return *alive_; }
    explicit operator bool() const { return alive(); }

   private:
    friend class Liveness;
    explicit Token(std::shared_ptr<const bool> alive) : alive_(std::move(alive)) {}
    std::shared_ptr<const bool> alive_;
  };

  Liveness() = default;
  ~Liveness() { revoke(); }
  // Copies would share nothing with the owner they were made from.
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  Token token() const { return Token(alive_); }
  // Every token says dead from here on.
  void revoke() { *alive_ = false; }

 private:
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace ddprun::base
