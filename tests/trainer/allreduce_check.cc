// Rank program for the test "bucketed all-reduce equals unbucketed": run it
// as 2 ranks with torchrun's environment. Each rank computes gradients of the
// MLP on its own data three ways and checks they agree bit for bit:
//   A: DDP, hooks on, small buckets (several all-reduces overlap backward)
//   B: DDP, hooks off, one big bucket, reduced after backward
//   C: no DDP: every parameter's gradient all-reduced alone, then averaged
// It also checks the averaged gradient differs from the local one (the
// ranks really exchanged data). Exit 0 and "allreduce_check ok" when all hold.
#include <cstdio>
#include <cstdlib>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "trainer/ddp.h"
#include "trainer/gloo_communicator.h"
#include "trainer/model.h"
#include "trainer/shm_communicator.h"
#include "trainer/store_select.h"

using namespace ddprun::trainer;

namespace {

std::vector<at::Tensor> clone_params(const Mlp& from, Mlp& to) {
  at::NoGradGuard g;
  for (size_t k = 0; k < from.parameters().size(); ++k) {
    to.parameters()[k].detach().copy_(from.parameters()[k].detach());
  }
  return to.parameters();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string backend = argc > 1 ? argv[1] : "gloo";
  StoreChoice sc;
  sc.rank = std::atoi(std::getenv("RANK"));
  sc.world_size = std::atoi(std::getenv("WORLD_SIZE"));
  sc.master_port = std::atoi(std::getenv("MASTER_PORT"));
  sc.timeout = std::chrono::seconds(60);
  GlooOptions go;
  go.rank = sc.rank;
  go.world_size = sc.world_size;
  go.timeout = std::chrono::seconds(60);
  auto store = make_store(sc);
  std::unique_ptr<Communicator> owner;
  if (backend == "shm") {
    ShmOptions so;
    so.rank = sc.rank;
    so.world_size = sc.world_size;
    so.slot_bytes = 64 << 10;  // small slots: the 401 KiB bucket goes in chunks
    owner = make_shm_communicator(*store, so);
  } else {
    owner = std::make_unique<GlooCommunicator>(store, go);
  }
  Communicator& comm = *owner;

  at::manual_seed(0);
  Mlp a(784, 128, 10), b(784, 128, 10), c(784, 128, 10);
  clone_params(a, b);
  clone_params(a, c);
  Dataset data = synthetic_dataset(32, 784, 10, 100 + sc.rank);  // different per rank

  DdpOptions small;
  small.bucket_bytes = 64 << 10;  // 64 KiB: the 401 KiB first layer alone, the rest grouped
  DistributedDataParallel ddp_a(a.parameters(), comm, small);
  DdpOptions one;
  one.overlap = false;
  DistributedDataParallel ddp_b(b.parameters(), comm, one);
  if (ddp_a.num_buckets() < 3 || ddp_b.num_buckets() != 1) {
    std::printf("unexpected bucket counts %zu %zu\n", ddp_a.num_buckets(), ddp_b.num_buckets());
    return 1;
  }

  ddp_a.begin_backward();
  a.loss(data.x, data.y).backward();
  ddp_a.finish_backward();
  ddp_b.begin_backward();
  b.loss(data.x, data.y).backward();
  ddp_b.finish_backward();
  c.loss(data.x, data.y).backward();

  int bad = 0;
  bool exchanged = false;
  for (size_t k = 0; k < c.parameters().size(); ++k) {
    at::Tensor local = c.parameters()[k].grad().clone();
    at::Tensor avg = local.clone();
    comm.allreduce(avg);
    avg.mul_(1.0 / comm.world_size());
    const at::Tensor& ga = ddp_a.averaged_grad(k);
    const at::Tensor& gb = ddp_b.averaged_grad(k);
    if (!at::equal(ga, avg) || !at::equal(gb, avg)) {
      std::printf("rank %d param %zu: bucketed and unbucketed gradients differ (max %g)\n",
                  sc.rank, k, (ga - avg).abs().max().item<double>());
      ++bad;
    }
    // The bucketed path leaves the local gradient in .grad; A's must be this rank's own.
    if (!at::equal(a.parameters()[k].grad(), local)) ++bad;
    exchanged = exchanged || !at::equal(avg, local);
  }
  if (!exchanged) {
    std::printf("rank %d: averaged gradients equal local ones: nothing was exchanged\n", sc.rank);
    return 1;
  }
  if (bad != 0) return 1;
  std::printf("allreduce_check ok %s rank %d buckets %zu\n", backend.c_str(), sc.rank,
              ddp_a.num_buckets());
  return 0;
}
