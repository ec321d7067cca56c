#include "agent/recovery_channel.h"

#include <errno.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <array>

#include "base/recovery_wire.h"
#include "base/system_error.h"

namespace ddprun::agent {

RecoveryChannel::Pair RecoveryChannel::open(boost::asio::io_context& io) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    throw base::SystemError("socketpair", "recovery channel", errno);
  base::ScopedFd mine(sv[0]), theirs(sv[1]);
  // Only the agent's end: the worker's stays blocking, as a program expects
  // of a descriptor it is given.
  const int flags = ::fcntl(mine.get(), F_GETFL);
  if (flags < 0 || ::fcntl(mine.get(), F_SETFL, flags | O_NONBLOCK) != 0)
    throw base::SystemError("fcntl O_NONBLOCK", "recovery channel", errno);
  Pair p;
  p.agent.reset(new RecoveryChannel(io, std::move(mine)));
  p.worker = std::move(theirs);
  return p;
}

RecoveryChannel::RecoveryChannel(boost::asio::io_context& io, base::ScopedFd fd)
    : sock_(io, fd.release()) {}

RecoveryChannel::~RecoveryChannel() {
  alive_.revoke();
  close();
}

void RecoveryChannel::start(OnPacket on_packet) {
  on_packet_ = std::move(on_packet);
  wait();
}

void RecoveryChannel::wait() {
  if (!sock_.is_open()) return;
  sock_.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                   [this, alive = alive_.token()](const boost::system::error_code& ec) {
                     if (!alive || ec) return;
                     read_ready();
                   });
}

void RecoveryChannel::read_ready() {
  // One byte over the limit: a longer packet shows as truncated (MSG_TRUNC
  // reports its real size) and is dropped whole.
  std::array<char, base::recovery_wire::kMaxPacketBytes + 1> buf;
  for (;;) {
    const ssize_t n = ::recv(sock_.native_handle(), buf.data(), buf.size(), MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n <= 0) {
      // 0: the worker's end is closed (it exited); an error: nothing more
      // will come either.
      close();
      return;
    }
    if (static_cast<size_t>(n) > base::recovery_wire::kMaxPacketBytes) {
      spdlog::debug("recovery channel: a {}-byte packet dropped (limit {})", n,
                    base::recovery_wire::kMaxPacketBytes);
      continue;
    }
    auto alive = alive_.token();
    if (on_packet_) on_packet_(std::string_view(buf.data(), static_cast<size_t>(n)));
    if (!alive || !sock_.is_open()) return;  // the callback closed or destroyed us
  }
  wait();
}

bool RecoveryChannel::send(std::string_view packet) {
  if (!sock_.is_open()) return false;
  ssize_t n;
  do {
    n = ::send(sock_.native_handle(), packet.data(), packet.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(packet.size());
}

void RecoveryChannel::close() {
  if (!sock_.is_open()) return;
  boost::system::error_code ignored;
  sock_.close(ignored);
}

}  // namespace ddprun::agent
