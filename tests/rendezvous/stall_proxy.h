// A TCP proxy on 127.0.0.1 in front of a store that can hold every byte
// for a while, in both directions: the delay a lossy link or a stalled
// store host puts on a node's store calls, injected without root. It can
// also lose one reply: the request reaches the store and is carried out,
// and the connection closes before the client sees the answer (a member
// that died right after committing).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <list>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace ddprun::rendezvous::testing {

class StallProxy {
 public:
  explicit StallProxy(uint16_t target) : target_(target) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(listen_fd_, 64) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      throw std::runtime_error("stall proxy: cannot listen");
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~StallProxy() {
    stop_ = true;
    thread_.join();
    for (auto& p : pairs_) ::close(p.client), ::close(p.server);
    ::close(listen_fd_);
  }
  StallProxy(const StallProxy&) = delete;
  StallProxy& operator=(const StallProxy&) = delete;

  uint16_t port() const { return port_; }
  // While stalled, bytes are accepted but not passed on (new connections
  // too); they flow again, in order, when the stall ends.
  void stall(bool on) { stalled_ = on; }
  // The next request whose bytes contain `text` is passed on; the reply to
  // it is dropped and its connection closed. Call before that request.
  void lose_reply_to(std::string text) {
    std::lock_guard<std::mutex> lock(mutex_);
    lose_text_ = std::move(text);
  }
  // True once a reply was lost that way.
  bool lost_one() const { return lost_one_; }
  // The next `n` connections never see a byte from the store (their
  // greeting is lost), though they stay open.
  void mute_next_connections(int n) { mute_next_ = n; }
  int muted() const { return muted_; }

 private:
  struct Pair {
    int client, server;
    bool losing = false;  // the store's next bytes to this client are dropped
    bool mute = false;    // every byte from the store to this client is dropped
  };

  void run() {
    while (!stop_) {
      std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
      if (!stalled_) {
        for (auto& p : pairs_) {
          fds.push_back({p.client, POLLIN, 0});
          fds.push_back({p.server, POLLIN, 0});
        }
      }
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;  // 20 ms: notices stop_ and stall
      if (fds[0].revents & POLLIN) accept_one();
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        auto it = std::next(pairs_.begin(), static_cast<long>((i - 1) / 2));
        int from = fds[i].fd, to = from == it->client ? it->server : it->client;
        if (!pump(*it, from, to)) {
          ::close(it->client), ::close(it->server);
          it->client = it->server = -1;
        }
      }
      pairs_.remove_if([](const Pair& p) { return p.client < 0; });
    }
  }

  void accept_one() {
    int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(target_);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(c), ::close(s);
      return;
    }
    Pair p{c, s};
    if (mute_next_ > 0) {
      --mute_next_;
      ++muted_;
      p.mute = true;
    }
    pairs_.push_back(p);
  }

  // Copies what is readable on `from` to `to`; false on EOF or error, and
  // when a reply was just lost (the pair is then closed).
  bool pump(Pair& pair, int from, int to) {
    char buf[65536];
    ssize_t n = ::recv(from, buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0) return false;
    if (from == pair.server && pair.mute) return true;
    if (from == pair.server && pair.losing) {
      lost_one_ = true;
      return false;
    }
    if (from == pair.client) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!lose_text_.empty() &&
          std::string_view(buf, static_cast<size_t>(n)).find(lose_text_) != std::string_view::npos) {
        pair.losing = true;
        lose_text_.clear();
      }
    }
    for (ssize_t off = 0; off < n;) {
      ssize_t w = ::send(to, buf + off, static_cast<size_t>(n - off), MSG_NOSIGNAL);
      if (w <= 0) return false;
      off += w;
    }
    return true;
  }

  uint16_t target_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::list<Pair> pairs_;
  std::atomic<bool> stop_{false}, stalled_{false}, lost_one_{false};
  std::atomic<int> mute_next_{0}, muted_{0};
  std::mutex mutex_;
  std::string lose_text_;
  std::thread thread_;
};

}  // namespace ddprun::rendezvous::testing
