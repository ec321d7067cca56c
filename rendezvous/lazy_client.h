// LazyStore: store calls from a background thread (NodeBoard's, PeerGuards')
// that must never fail the thread. The connection is opened at the first
// call; a failed call drops it (the next call opens a new one) and is
// reported to `on_error` once until a call succeeds again, so a store that
// is gone for a while is one line, not one a call. A call after the
// canceller fired fails quietly: the owner is shutting down.
//
// Thread safety: one thread.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "rendezvous/canceller.h"
#include "rendezvous/client.h"

namespace ddprun::rendezvous {

class LazyStore {
 public:
  // `open` makes a connection (any Store: the TCP client, etcd); it may
  // throw, which counts as a failed call.
  LazyStore(std::function<std::unique_ptr<Store>()> open, std::shared_ptr<Canceller> canceller,
            std::function<void(const std::string&)> on_error)
      : open_(std::move(open)), canceller_(std::move(canceller)), on_error_(std::move(on_error)) {}

  // The TCP client at `store_addr` ("host:port"), every deadline (connect,
  // call, reply) `deadline`; the address is parsed at the first call, so a
  // bad one is one reported failure like any other.
  static LazyStore tcp(const std::string& store_addr, std::string token, Duration deadline,
                       std::shared_ptr<Canceller> canceller,
                       std::function<void(const std::string&)> on_error) {
    ClientOptions o;
    o.token = std::move(token);
    o.connect_timeout = o.op_timeout = o.reply_grace = deadline;
    o.canceller = canceller;
    return LazyStore(
        [store_addr, o]() mutable -> std::unique_ptr<Store> {
          std::tie(o.host, o.port) = parse_host_port(store_addr, "store address");
          return std::make_unique<Client>(o);
        },
        std::move(canceller), std::move(on_error));
  }

  // The last failure's text; "" after a success.
  const std::string& last_error() const { return last_error_; }

  // Runs call(Store&); false when it (or opening the connection) threw.
  template <class Call>
  bool call(const Call& call) {
    try {
      if (!store_) store_ = open_();
      call(*store_);
      last_error_.clear();
      return true;
    } catch (const std::exception& e) {
      store_.reset();
      if (canceller_->cancelled()) return false;
      if (last_error_ != e.what()) on_error_(e.what());
      last_error_ = e.what();
      return false;
    }
  }

 private:
  std::function<std::unique_ptr<Store>()> open_;
  std::shared_ptr<Canceller> canceller_;
  std::function<void(const std::string&)> on_error_;
  std::unique_ptr<Store> store_;
  std::string last_error_;
};

}  // namespace ddprun::rendezvous
