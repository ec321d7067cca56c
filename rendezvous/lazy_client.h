// LazyClient: store calls from a background thread (NodeBoard's, PeerGuards')
// that must never fail the thread. The connection is made at the first call;
// a failed call drops it (the next call makes a new one) and is reported to
// `on_error` once until a call succeeds again, so a store that is gone for a
// while is one line, not one a call. A call after the canceller fired fails
// quietly: the owner is shutting down.
//
// Thread safety: one thread.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "rendezvous/canceller.h"
#include "rendezvous/client.h"

namespace ddprun::rendezvous {

class LazyClient {
 public:
  // Every deadline (connect, call, reply) is `deadline`.
  LazyClient(const std::string& store_addr, std::string token, Duration deadline,
             std::shared_ptr<Canceller> canceller, std::function<void(const std::string&)> on_error)
      : store_addr_(store_addr), canceller_(std::move(canceller)), on_error_(std::move(on_error)) {
    options_.token = std::move(token);
    options_.connect_timeout = options_.op_timeout = options_.reply_grace = deadline;
    options_.canceller = canceller_;
  }

  // The last failure's text; "" after a success.
  const std::string& last_error() const { return last_error_; }

  // Runs call(Client&); false when it (or connecting) threw.
  template <class Call>
  bool call(const Call& call) {
    try {
      if (!client_) {
        // Parsed here, so a bad address is one reported failure like any other.
        std::tie(options_.host, options_.port) = parse_host_port(store_addr_, "store address");
        client_.emplace(options_);
      }
      call(*client_);
      last_error_.clear();
      return true;
    } catch (const std::exception& e) {
      client_.reset();
      if (canceller_->cancelled()) return false;
      if (last_error_ != e.what()) on_error_(e.what());
      last_error_ = e.what();
      return false;
    }
  }

 private:
  std::string store_addr_;
  ClientOptions options_;
  std::shared_ptr<Canceller> canceller_;
  std::function<void(const std::string&)> on_error_;
  std::optional<Client> client_;
  std::string last_error_;
};

}  // namespace ddprun::rendezvous
