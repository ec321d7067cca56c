#include "trainer/gloo_communicator.h"
#include "base/scoped_fd.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

namespace ddprun::trainer {
namespace {

class GlooHandle : public CollectiveHandle {
 public:
  explicit GlooHandle(c10::intrusive_ptr<c10d::Work> work) : work_(std::move(work)) {}
  void wait() override { work_->wait(); }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
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
  return std::make_unique<GlooHandle>(pg_->allreduce(tensors));
}

void GlooCommunicator::broadcast(at::Tensor& tensor, int root) {
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  pg_->broadcast(tensors, opts)->wait();
}

void GlooCommunicator::barrier() { pg_->barrier()->wait(); }

}  // namespace ddprun::trainer
