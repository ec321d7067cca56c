// The agent's end of one worker's recovery channel (--restart-scope=rank,
// docs/RECOVERY.md): an AF_UNIX SOCK_SEQPACKET socket pair per worker, one
// end inherited by the worker as DDPRUN_RECOVERY_FD, the other read here on
// the agent's loop.
//
// The agent never blocks on it: reads wait on the loop (Asio's readiness
// wait, then recv with MSG_DONTWAIT until EAGAIN), and send() is one
// non-blocking packet that a full socket drops (a worker that never reads
// costs nothing; the next failure supersedes a lost message). Packets are
// base/recovery_wire.h's; one over its limit is truncated by the kernel and
// dropped here. The worker's exit closes its end: reading stops at EOF.
//
// Move-only owner (it holds the descriptor); not thread-safe: the loop's
// thread only.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <functional>
#include <memory>
#include <string_view>

#include "base/liveness.h"
#include "base/scoped_fd.h"

namespace ddprun::agent {

class RecoveryChannel {
 public:
  using OnPacket = std::function<void(std::string_view packet)>;
  struct Pair;
  // A fresh socket pair: the agent's end (close-on-exec, non-blocking) and
  // the worker's (close-on-exec too, cleared by the worker's own fork only:
  // SpawnRequest::inherit_fds). Throws base::SystemError (EMFILE).
  static Pair open(boost::asio::io_context& io);

  ~RecoveryChannel();
  RecoveryChannel(const RecoveryChannel&) = delete;
  RecoveryChannel& operator=(const RecoveryChannel&) = delete;

  // Starts reading; `on_packet` gets each packet (not parsed) on the loop.
  void start(OnPacket on_packet);
  // One packet, never blocking; false when it was not sent (the socket is
  // full, or the worker's end is gone).
  bool send(std::string_view packet);
  // Stops reading and closes the agent's end.
  void close();
  bool is_open() const { return sock_.is_open(); }

 private:
  RecoveryChannel(boost::asio::io_context& io, base::ScopedFd fd);
  void wait();
  void read_ready();

  boost::asio::posix::stream_descriptor sock_;
  OnPacket on_packet_;
  // False once destroyed: a readiness handler still queued must not land.
  base::Liveness alive_;
};

struct RecoveryChannel::Pair {
  std::unique_ptr<RecoveryChannel> agent;
  base::ScopedFd worker;
};

}  // namespace ddprun::agent
