#include "trainer/generation.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "trainer/error.h"
#include "trainer/gloo_communicator.h"
#include "trainer/log.h"
#include "trainer/nccl_communicator.h"
#include "trainer/shm_communicator.h"

namespace ddprun::trainer {

std::string generation_prefix(int restart_count, int64_t generation) {
  return "ddprun_train/r" + std::to_string(restart_count) + "/g" + std::to_string(generation) +
         "/";
}

namespace {

std::unique_ptr<Communicator> make_backend(const TrainOptions& o, const WorkerInfo& w,
                                           const c10::intrusive_ptr<c10d::Store>& store,
                                           const GenerationScope& scope, at::Device* device) {
  Backend backend = o.backend;
  const auto timeout = std::chrono::milliseconds(int64_t(o.collective_timeout_s * 1000));
  // Generation 0 keeps the keys it always had; a later one gets its own.
  const std::string prefix =
      scope.generation > 0 ? generation_prefix(w.restart_count, scope.generation) : "";
  std::string why;
  const bool one_host = w.local_world_size == w.world_size;
  const bool automatic = backend == Backend::kAuto;
  if (automatic) {
    backend = nccl_available(&why) ? Backend::kNccl
              : one_host && w.world_size > 1 ? Backend::kShm
                                             : Backend::kGloo;
  }
  if (backend == Backend::kNccl) {
    if (!nccl_available(&why)) throw TrainerError("--backend nccl: " + why);
    *device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(w.local_rank));
    NcclOptions no;
    no.rank = w.rank;
    no.world_size = w.world_size;
    no.device = w.local_rank;
    no.timeout = timeout;
    no.abort = scope.abort;
    if (!prefix.empty()) no.key_prefix = prefix;
    return make_nccl_communicator(*store, no);
  }
  *device = at::Device(at::kCPU);
  if (backend == Backend::kShm) {
    if (!one_host) {
      throw TrainerError("--backend shm: ranks span hosts (LOCAL_WORLD_SIZE " +
                         std::to_string(w.local_world_size) + " < WORLD_SIZE " +
                         std::to_string(w.world_size) + "); use gloo");
    }
    ShmOptions so;
    so.rank = w.rank;
    so.world_size = w.world_size;
    so.timeout = timeout;
    so.abort = scope.abort;
    if (!prefix.empty()) so.key_prefix = prefix;
    try {
      return make_shm_communicator(*store, so);
    } catch (const ShmNoRoom& e) {
      if (!automatic) throw TrainerError(std::string("--backend shm: ") + e.what());
      // Every rank gets ShmNoRoom (rank 0 decided for all), so all fall back.
      log_warn("%s: --backend auto uses gloo", e.what());
    }
  }
  GlooOptions go;
  go.rank = w.rank;
  go.world_size = w.world_size;
  go.timeout = timeout;
  go.single_host = w.local_world_size == w.world_size;
  go.peer_addr = w.master_addr;
  go.abort = scope.abort;
  if (prefix.empty()) return std::make_unique<GlooCommunicator>(store, go);
  // ProcessGroupGloo keys its peers' addresses by rank alone: a prefix
  // keeps generation G from reading G-1's. (PrefixStore adds the '/'.)
  auto scoped = c10::make_intrusive<c10d::PrefixStore>(prefix.substr(0, prefix.size() - 1), store);
  return std::make_unique<GlooCommunicator>(scoped, go);
}

}  // namespace

std::unique_ptr<Communicator> make_communicator(const TrainOptions& o, const WorkerInfo& w,
                                                const c10::intrusive_ptr<c10d::Store>& store,
                                                const GenerationScope& scope, at::Device* device) {
  return classify_failures(make_backend(o, w, store, scope, device));
}

}  // namespace ddprun::trainer
