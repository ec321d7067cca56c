// Client's way to the store: resolving the host, the non-blocking connect
// with its deadline, and the retries with back-off while the store is not
// up yet (client.h). The handshake and the calls are client.cc's.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include "base/scoped_fd.h"
#include "base/system_error.h"
#include "rendezvous/client.h"

namespace ddprun::rendezvous {

void Client::connect(Clock::time_point cap) {
  const auto start = Clock::now();
  const auto deadline = std::min(start + options_.connect_timeout, cap);
  std::string last_error = "no attempt";
  auto backoff = std::chrono::milliseconds(10);
  // Each attempt (connect, greeting, authentication) has a window of its
  // own, growing from kFirstAttemptWindow, so a lost SYN, greeting or auth
  // reply costs one window and another try, not the whole connect_timeout.
  Duration window = kFirstAttemptWindow;
  for (;;) {
    disconnect();
    throw_if_cancelled("connect");
    auto attempt_deadline = std::min(deadline, Clock::now() + window);
    if (open_connection(attempt_deadline, last_error)) {
      // Without a token the greeting is read with the first reply: the
      // first request goes out at once instead of a round trip later.
      // With one, the client must see the store's proof
      // before it sends anything (authenticate()).
      if (options_.token.empty()) {
        greeted_ = false;
        was_connected_ = true;
        return;
      }
      if (handshake(attempt_deadline, deadline, last_error)) {
        greeted_ = true;
        was_connected_ = true;
        return;
      }
    }
    throw_if_cancelled("connect");
    // A store that served this client once and now refuses is gone (its
    // host answers, nothing listens): waiting out connect_timeout for it
    // only delays the survivors' failover (docs/multinode.md). A store not
    // up yet, at the first connect, is waited for as before.
    if (was_connected_ && all_refused_)
      throw StoreGoneError("store at " + address_ + " is gone: its host refuses connections (" +
                           last_error + ")");
    if (Clock::now() + backoff >= deadline) {
      throw StoreError(
          "cannot connect to store at " + address_ + " within " +
          std::to_string(std::chrono::duration_cast<Duration>(deadline - start).count()) +
          " ms: " + last_error);
    }
    std::this_thread::sleep_for(backoff);  // the server may still be starting
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
    window = std::min(window * 2, kMaxAttemptWindow);
  }
}

bool Client::open_connection(Clock::time_point deadline, std::string& last_error) {
  // A numeric address needs no resolver: getaddrinfo reads /etc/gai.conf
  // and /etc/hosts on every call (three opens a connect), which a barrier
  // of thousands of clients pays thousands of times.
  sockaddr_storage numeric{};
  addrinfo ai{};
  ai.ai_socktype = SOCK_STREAM;
  ai.ai_addr = reinterpret_cast<sockaddr*>(&numeric);
  auto* v4 = reinterpret_cast<sockaddr_in*>(&numeric);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&numeric);
  if (inet_pton(AF_INET, options_.host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = ai.ai_family = AF_INET;
    v4->sin_port = htons(options_.port);
    ai.ai_addrlen = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, options_.host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = ai.ai_family = AF_INET6;
    v6->sin6_port = htons(options_.port);
    ai.ai_addrlen = sizeof(sockaddr_in6);
  }
  all_refused_ = true;  // until an address does anything but refuse
  if (ai.ai_family != 0) {
    fd_ = connect_to(ai, deadline, last_error);
    armed_ms_ = 0;
    return fd_ >= 0;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(options_.host.c_str(), std::to_string(options_.port).c_str(), &hints, &res);
  if (rc != 0) {
    last_error = std::string("cannot resolve host: ") + gai_strerror(rc);
    all_refused_ = false;
    return false;
  }
  for (addrinfo* ai = res; ai != nullptr && fd_ < 0; ai = ai->ai_next) {
    int fd = connect_to(*ai, deadline, last_error);
    if (fd < 0) continue;
    fd_ = fd;
    armed_ms_ = 0;
  }
  freeaddrinfo(res);
  return fd_ >= 0;
}

int Client::connect_to(const addrinfo& ai, Clock::time_point deadline, std::string& last_error) {
  int fd = ::socket(ai.ai_family, ai.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    all_refused_ = false;
    last_error = base::describe_error("socket", "", errno);
    return -1;
  }
  // Registered before connecting: a cancel wakes the poll below.
  if (options_.canceller) options_.canceller->add(fd);
  int err = 0;
  if (::connect(fd, ai.ai_addr, ai.ai_addrlen) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int n = ::poll(&p, 1, ms_left(deadline));
      socklen_t len = sizeof(err);
      // Writable without POLLERR/POLLHUP is a connection; only a failed
      // one needs SO_ERROR for its reason.
      if (n == 1 && (p.revents & (POLLERR | POLLHUP)) != 0)
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      else if (n == 1) err = 0;
      else err = n == 0 ? ETIMEDOUT : errno;
    }
  }
  if (err != 0) {
    last_error = base::describe_error("connect", "", err);
    if (err != ECONNREFUSED) all_refused_ = false;
    close_fd(fd);
    return -1;
  }
  all_refused_ = false;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // Blocking from here on, with SO_RCVTIMEO/SO_SNDTIMEO as the clock:
  // a call costs one send and one recv instead of poll + recv.
  // The socket was made with O_NONBLOCK as its only status flag.
  if (fcntl(fd, F_SETFL, 0) != 0) {
    last_error = base::describe_error("fcntl", "", errno);
    close_fd(fd);
    return -1;
  }
  return fd;
}

}  // namespace ddprun::rendezvous
