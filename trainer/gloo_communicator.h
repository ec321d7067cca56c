// Communicator over c10d::ProcessGroupGloo (CPU tensors).
//
// The ranks meet through a c10d::Store (our rendezvous store through
// C10dStoreAdapter under ddprun, or c10d::TCPStore under torchrun). The
// network device: GLOO_SOCKET_IFNAME when set (as in PyTorch), loopback when
// every rank is on this host, otherwise the local address that routes to
// peer_addr (MASTER_ADDR). PyTorch uses the host name's address, which on
// many hosts resolves to 127.0.1.1 and strands the other nodes.
//
// With an AbortSource (rank scope) a wait does not block in Work::wait():
// a callback on the Work's future writes an eventfd, and the wait polls it
// and the source's descriptor together. A dead peer's closed socket is not
// enough there: a survivor can wait on another survivor that already left
// the collective.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <c10/util/intrusive_ptr.h>

#include "trainer/abort_source.h"
#include "trainer/communicator.h"

namespace c10d {
class Store;
class ProcessGroupGloo;
}  // namespace c10d

namespace ddprun::trainer {

struct GlooOptions {
  int rank = 0;
  int world_size = 1;
  // Every rank runs on this host (LOCAL_WORLD_SIZE == WORLD_SIZE): bind to
  // 127.0.0.1 and skip host-name resolution.
  bool single_host = true;
  // An address every rank can reach (MASTER_ADDR); across hosts, gloo binds
  // to the local address the route to it leaves from.
  std::string peer_addr;
  // Deadline of every collective; a dead peer fails the step after it.
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
  // Gloo worker threads; async all-reduces run on them.
  int threads = 2;
  // --restart-scope=rank: every wait also polls this, and throws
  // CollectiveAborted once it asks (abort_source.h). The collective is then
  // abandoned, not cancelled: gloo's threads may still write its tensors
  // until its own timeout, so the caller keeps them and this communicator
  // alive. nullptr: Work::wait() as before.
  AbortSource* abort = nullptr;
};

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(const c10::intrusive_ptr<c10d::Store>& store, const GlooOptions& options);
  ~GlooCommunicator() override;

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }
  std::string backend() const override { return "gloo"; }

  std::unique_ptr<CollectiveHandle> allreduce_async(at::Tensor& tensor) override;
  void broadcast(at::Tensor& tensor, int root) override;
  void barrier() override;

 private:
  GlooOptions options_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
};

}  // namespace ddprun::trainer
