#include "trainer/gloo_communicator.h"

#include <cstdlib>
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
