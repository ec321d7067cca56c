#include "trainer/nccl_communicator.h"

#include "trainer/error.h"

#if defined(DDPRUN_WITH_NCCL) || defined(DDPRUN_NCCL_COMPILE_CHECK)
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#endif

namespace ddprun::trainer {

#if defined(DDPRUN_WITH_NCCL) || defined(DDPRUN_NCCL_COMPILE_CHECK)
namespace {

void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    throw TrainerError(std::string("CUDA ") + what + ": " + cudaGetErrorString(rc));
  }
}

void check_nccl(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess) {
    throw TrainerError(std::string("NCCL ") + what + ": " + ncclGetErrorString(rc));
  }
}

ncclDataType_t nccl_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kLong: return ncclInt64;
    case at::kInt: return ncclInt32;
    case at::kByte: return ncclUint8;
    case at::kChar: return ncclInt8;
    default:
      throw TrainerError(std::string("NCCL: unsupported tensor type ") +
                         c10::toString(t.scalar_type()));
  }
}

class NcclCommunicator;

// wait(): until the collective's event fires, within --collective-timeout.
class NcclHandle : public CollectiveHandle {
 public:
  NcclHandle(cudaEvent_t done, NcclCommunicator* comm) : done_(done), comm_(comm) {}
  ~NcclHandle() override { cudaEventDestroy(done_); }
  void wait() override;

 private:
  cudaEvent_t done_;
  NcclCommunicator* comm_;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(c10d::Store& store, const NcclOptions& o) : options_(o) {
    check_cuda(cudaSetDevice(o.device), "set device");
    ncclUniqueId id;
    const std::string key = o.key_prefix + "nccl_id";
    if (o.rank == 0) {
      check_nccl(ncclGetUniqueId(&id), "get unique id");
      std::vector<uint8_t> bytes(sizeof(id));
      std::memcpy(bytes.data(), &id, sizeof(id));
      store.set(key, bytes);
    } else {
      std::vector<uint8_t> bytes = store.get(key);  // store's own deadline
      if (bytes.size() != sizeof(id)) {
        throw TrainerError("NCCL: store key " + key + " holds " +
                           std::to_string(bytes.size()) + " bytes, not an ncclUniqueId");
      }
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    check_nccl(ncclCommInitRank(&comm_, o.world_size, id, o.rank), "comm init rank");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream create");
    check_cuda(cudaMalloc(&scratch_, sizeof(float)), "malloc");
  }
  ~NcclCommunicator() override {
    if (!aborted_) {
      // Bounded: a hung collective must not turn into a hung exit.
      try {
        wait_done(record_done(), "shutdown");
      } catch (const TrainerError&) {
      }
    }
    cudaFree(scratch_);
    if (!aborted_) ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }
  std::string backend() const override { return "nccl"; }

  std::unique_ptr<CollectiveHandle> allreduce_async(at::Tensor& t) override {
    check_tensor(t);
    follow_torch_stream();
    check_nccl(ncclAllReduce(t.data_ptr(), t.data_ptr(), size_t(t.numel()), nccl_type(t),
                             ncclSum, comm_, stream_),
               "all-reduce");
    return std::make_unique<NcclHandle>(record_done(), this);
  }

  void broadcast(at::Tensor& t, int root) override {
    check_tensor(t);
    follow_torch_stream();
    check_nccl(ncclBroadcast(t.data_ptr(), t.data_ptr(), size_t(t.numel()), nccl_type(t),
                             root, comm_, stream_),
               "broadcast");
    wait_done(record_done(), "broadcast");
  }

  void barrier() override {
    check_nccl(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_),
               "barrier");
    wait_done(record_done(), "barrier");
  }

  // Blocks until `ev` (recorded on our stream after a collective) fires,
  // then orders LibTorch's current stream after it; destroys `ev` unless it
  // belongs to a handle. CUDA has no wait with a deadline, so the event is
  // polled; past --collective-timeout, or on an asynchronous NCCL error, the
  // communicator is aborted (ncclCommAbort, as torch's NCCL watchdog does)
  // and the rank fails cleanly for the agent to restart the group.
  void wait_done(cudaEvent_t ev, const char* what, bool owned = true) {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point deadline = Clock::now() + options_.timeout;
    struct Destroy {
      cudaEvent_t ev;
      bool owned;
      ~Destroy() { if (owned) cudaEventDestroy(ev); }
    } destroy{ev, owned};
    for (int polls = 0;; ++polls) {
      const cudaError_t q = cudaEventQuery(ev);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) check_cuda(q, what);
      ncclResult_t async = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm_, &async), "async error query");
      if (async != ncclSuccess && async != ncclInProgress) {
        abort_comm();
        throw TrainerError(std::string("NCCL ") + what + " failed: " + ncclGetErrorString(async) +
                           " (communicator aborted)");
      }
      // Rank scope: a failure announced on the recovery channel. Checked
      // every 64 polls while spinning (a recv each), every poll after.
      if (options_.abort != nullptr && (polls > 1000 || polls % 64 == 0) &&
          options_.abort->requested()) {
        abort_comm();
        throw CollectiveAborted(std::string("NCCL ") + what +
                                ": abandoned, a peer failed (communicator aborted)");
      }
      if (Clock::now() >= deadline) {
        abort_comm();
        throw TrainerError(std::string("NCCL ") + what + " did not finish within " +
                           std::to_string(options_.timeout.count() / 1000.0) +
                           " s (--collective-timeout): communicator aborted (ncclCommAbort)");
      }
      // Spin briefly (most collectives end within microseconds of the
      // kernel), then poll every 50 us instead of burning a core.
      if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    check_cuda(cudaStreamWaitEvent(torch_stream(), ev, 0), "stream wait");
  }

 private:
  void check_tensor(const at::Tensor& t) const {
    if (!t.is_cuda() || !t.is_contiguous()) {
      throw TrainerError("NCCL: collectives need contiguous CUDA tensors");
    }
  }
  // LibTorch's current stream on our device (not the legacy default one:
  // code under a torch::StreamGuard queues its kernels elsewhere).
  cudaStream_t torch_stream() const {
    return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(options_.device)).stream();
  }
  void abort_comm() {
    if (!aborted_) ncclCommAbort(comm_);
    aborted_ = true;
  }
  // The collective must see everything LibTorch queued before it.
  void follow_torch_stream() {
    if (aborted_) throw TrainerError("NCCL: the communicator was aborted after an earlier failure");
    cudaEvent_t ev;
    check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "event create");
    check_cuda(cudaEventRecord(ev, torch_stream()), "event record");
    check_cuda(cudaStreamWaitEvent(stream_, ev, 0), "stream wait");
    cudaEventDestroy(ev);
  }
  cudaEvent_t record_done() {
    cudaEvent_t ev;
    check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "event create");
    check_cuda(cudaEventRecord(ev, stream_), "event record");
    return ev;
  }

  NcclOptions options_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  bool aborted_ = false;

  friend class NcclHandle;
};

void NcclHandle::wait() { comm_->wait_done(done_, "all-reduce", /*owned=*/false); }

}  // namespace
#endif

#if defined(DDPRUN_WITH_NCCL)
bool nccl_available(std::string* why) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    if (why) *why = "no CUDA device visible";
    return false;
  }
  return true;
}

std::unique_ptr<Communicator> make_nccl_communicator(c10d::Store& store,
                                                     const NcclOptions& options) {
  return std::make_unique<NcclCommunicator>(store, options);
}
#else
bool nccl_available(std::string* why) {
  if (why) {
    *why = "this train was built without NCCL (needs CUDA, NCCL and a CUDA-enabled "
           "LibTorch at build time; see bench/train_nccl_gpu.sh)";
  }
  return false;
}

std::unique_ptr<Communicator> make_nccl_communicator(c10d::Store&, const NcclOptions&) {
  std::string why;
  nccl_available(&why);
  throw TrainerError("--backend nccl: " + why);
}
#endif

}  // namespace ddprun::trainer
