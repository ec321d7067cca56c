#include "trainer/gloo_communicator.h"
#include "base/scoped_fd.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "base/system_error.h"

namespace ddprun::trainer {
namespace {

// Work::wait(), or with an AbortSource, a wait that gives up when it asks.
void wait_work(c10d::Work& work, AbortSource* abort, std::chrono::milliseconds timeout,
               const char* what) {
  if (abort == nullptr) {
    work.wait();
    return;
  }
  if (abort->requested()) {
    throw CollectiveAborted(std::string("gloo ") + what + ": abandoned (a peer failed)");
  }
  if (work.isCompleted()) {
    work.wait();  // rethrows its error
    return;
  }
  // Shared with the callback, which may run on a gloo thread long after an
  // abandoned wait returned: the eventfd closes only when both are done
  // with it, so the callback never writes to a reused descriptor number.
  auto done = std::make_shared<base::ScopedFd>(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!*done) throw TrainerError("gloo: eventfd: " + base::errno_text(errno));
  work.getFuture()->addCallback([done](c10::ivalue::Future&) {
    const uint64_t one = 1;
    (void)!::write(done->get(), &one, sizeof one);  // a full counter is still readable
  });
  using Clock = std::chrono::steady_clock;
  // gloo's own timeout fails the collective first; this one only bounds the
  // wait should gloo never finish it.
  const Clock::time_point deadline = Clock::now() + timeout + std::chrono::seconds(10);
  for (;;) {
    pollfd fds[2] = {{done->get(), POLLIN, 0}, {abort->fd(), POLLIN, 0}};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      throw TrainerError(std::string("gloo ") + what + " did not finish within " +
                         std::to_string(timeout.count()) + " ms (--collective-timeout)");
    }
    const int n = ::poll(fds, 2, int(std::min<long long>(left, 60000)));
    if (n < 0 && errno != EINTR) throw TrainerError("gloo: poll: " + base::errno_text(errno));
    if (n > 0 && (fds[0].revents & POLLIN) != 0) {
      work.wait();  // completed (or failed): returns at once, or rethrows
      return;
    }
    if (n > 0 && fds[1].revents != 0 && abort->requested()) {
      throw CollectiveAborted(std::string("gloo ") + what + ": abandoned (a peer failed)");
    }
  }
}

class GlooHandle : public CollectiveHandle {
 public:
  GlooHandle(c10::intrusive_ptr<c10d::Work> work, const GlooOptions& o)
      : work_(std::move(work)), abort_(o.abort), timeout_(o.timeout) {}
  void wait() override { wait_work(*work_, abort_, timeout_, "all-reduce"); }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  AbortSource* abort_;
  std::chrono::milliseconds timeout_;
};

// The local address the kernel would send from to reach `peer` (a UDP
// connect sends nothing); empty when it cannot be found.
std::string local_address_towards(const std::string& peer) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (peer.empty() || getaddrinfo(peer.c_str(), "9", &hints, &found) != 0) return "";
  std::string result;
  for (addrinfo* a = found; a != nullptr && result.empty(); a = a->ai_next) {
    const base::ScopedFd sock(socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    const int fd = sock.get();
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    char text[INET6_ADDRSTRLEN] = {};
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      const void* bytes = local.ss_family == AF_INET
                              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (inet_ntop(local.ss_family, bytes, text, sizeof text) != nullptr) result = text;
    }
  }
  freeaddrinfo(found);
  return result;
}

}  // namespace

GlooCommunicator::GlooCommunicator(const c10::intrusive_ptr<c10d::Store>& store,
                                   const GlooOptions& options)
    : options_(options) {
  auto opts = c10d::ProcessGroupGloo::Options::create(options.timeout);
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname != nullptr && ifname[0] != '\0') {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  } else if (options.single_host) {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else if (std::string local = local_address_towards(options.peer_addr); !local.empty()) {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(local));
  } else {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  opts->threads = options.threads;
  pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store, options.rank, options.world_size,
                                                    opts);
}

GlooCommunicator::~GlooCommunicator() = default;

std::unique_ptr<CollectiveHandle> GlooCommunicator::allreduce_async(at::Tensor& tensor) {
  std::vector<at::Tensor> tensors{tensor};
  return std::make_unique<GlooHandle>(pg_->allreduce(tensors), options_);
}

void GlooCommunicator::broadcast(at::Tensor& tensor, int root) {
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  wait_work(*pg_->broadcast(tensors, opts), options_.abort, options_.timeout, "broadcast");
}

void GlooCommunicator::barrier() {
  wait_work(*pg_->barrier(), options_.abort, options_.timeout, "barrier");
}

}  // namespace ddprun::trainer
