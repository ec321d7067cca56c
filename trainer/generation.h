// The communicator a generation trains with.
//
// Generation 0 is the attempt's first group: it meets under the store keys
// it always had. With --restart-scope=rank a failed rank is replaced and the
// group re-forms as generation G (docs/RECOVERY.md), under its own key
// prefix "ddprun_train/r<restart count>/g<G>/", so nothing generation G-1
// wrote is read again: gloo gets the store wrapped in a c10d::PrefixStore,
// shm and NCCL a key_prefix. Every rank of a generation, survivor or
// replacement, resolves --backend the same way, so they agree on it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include "trainer/abort_source.h"
#include "trainer/communicator.h"
#include "trainer/trainer.h"

namespace c10d {
class Store;
}

namespace ddprun::trainer {

struct GenerationScope {
  int64_t generation = 0;
  // The recovery channel (rank scope), watched by every wait; nullptr in
  // group scope.
  AbortSource* abort = nullptr;
};

// "ddprun_train/r<restart_count>/g<generation>/".
std::string generation_prefix(int restart_count, int64_t generation);

// --backend resolved and the communicator built for `scope`; *device gets
// the device its tensors live on.
std::unique_ptr<Communicator> make_communicator(const TrainOptions& o, const WorkerInfo& w,
                                                const c10::intrusive_ptr<c10d::Store>& store,
                                                const GenerationScope& scope, at::Device* device);

}  // namespace ddprun::trainer
