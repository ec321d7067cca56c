#include "trainer/shm_communicator.h"

#include <fcntl.h>
#include <poll.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "trainer/error.h"

namespace ddprun::trainer {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kMaxRanks = 256;
constexpr size_t kHeaderBytes = 4096;

struct Header {
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> generation;
  std::atomic<int32_t> pids[kMaxRanks];
};
static_assert(sizeof(Header) <= kHeaderBytes);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

[[noreturn]] void throw_errno(const std::string& what) {
  throw TrainerError("shm communicator: " + what + ": " + std::strerror(errno));
}

class ShmHandle : public CollectiveHandle {
 public:
  explicit ShmHandle(std::shared_future<void> done) : done_(std::move(done)) {}
  void wait() override { done_.get(); }

 private:
  std::shared_future<void> done_;
};

class ShmCommunicator : public Communicator {
 public:
  ShmCommunicator(c10d::Store& store, const ShmOptions& o) : o_(o) {
    if (o.world_size > kMaxRanks) throw TrainerError("shm communicator: more than 256 ranks");
    bytes_ = kHeaderBytes + size_t(o.world_size) * size_t(o.slot_bytes);
    const std::string key = o.key_prefix + "shm_name";
    std::string name;
    if (o.rank == 0) {
      std::random_device rd;
      name = "/ddprun-train-" + std::to_string(::getpid()) + "-" + std::to_string(rd());
      fd_ = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd_ < 0) throw_errno("shm_open " + name);
      if (::ftruncate(fd_, off_t(bytes_)) != 0) {
        ::shm_unlink(name.c_str());
        throw_errno("ftruncate " + name + " (is /dev/shm large enough?)");
      }
      store.set(key, std::vector<uint8_t>(name.begin(), name.end()));
    } else {
      std::vector<uint8_t> v = store.get(key);
      name.assign(v.begin(), v.end());
      fd_ = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
      if (fd_ < 0) throw_errno("shm_open " + name);
    }
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) throw_errno("mmap " + name);
    base_ = static_cast<uint8_t*>(p);
    header_ = reinterpret_cast<Header*>(base_);  // zero-filled by ftruncate
    header_->pids[o.rank].store(::getpid());
    barrier_now();  // every rank has mapped it: the name can go
    if (o.rank == 0) ::shm_unlink(name.c_str());
    // pidfds, not kill(pid, 0): a dead peer its parent has not reaped yet
    // still answers kill(), but its pidfd already polls readable.
    for (int r = 0; r < o.world_size; ++r) {
      const int fd = r == o.rank ? -1 : int(::syscall(SYS_pidfd_open, header_->pids[r].load(), 0));
      peer_fds_.push_back(fd);
    }
    barrier_now();  // no rank leaves before every pidfd is open
    worker_ = std::thread([this] { run(); });
  }

  ~ShmCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
    for (int fd : peer_fds_) {
      if (fd >= 0) ::close(fd);
    }
    ::munmap(base_, bytes_);
    ::close(fd_);
  }

  int rank() const override { return o_.rank; }
  int world_size() const override { return o_.world_size; }
  std::string backend() const override { return "shm"; }

  std::unique_ptr<CollectiveHandle> allreduce_async(at::Tensor& t) override {
    check(t);
    at::Tensor tensor = t;
    return std::make_unique<ShmHandle>(enqueue([this, tensor] { allreduce_now(tensor); }));
  }
  void broadcast(at::Tensor& t, int root) override {
    check(t);
    at::Tensor tensor = t;
    enqueue([this, tensor, root] { broadcast_now(tensor, root); }).get();
  }
  void barrier() override {
    enqueue([this] { barrier_now(); }).get();
  }

 private:
  void check(const at::Tensor& t) const {
    if (!t.device().is_cpu() || !t.is_contiguous()) {
      throw TrainerError("shm communicator: tensors must be contiguous CPU tensors");
    }
  }

  std::shared_future<void> enqueue(std::function<void()> op) {
    auto task = std::make_shared<std::packaged_task<void()>>(std::move(op));
    std::shared_future<void> f = task->get_future().share();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back([task] { (*task)(); });
    }
    cv_.notify_one();
    return f;
  }

  void run() {
    for (;;) {
      std::function<void()> op;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        op = std::move(queue_.front());
        queue_.pop_front();
      }
      op();  // exceptions land in the packaged_task's future
    }
  }

  uint8_t* slot(int r) const { return base_ + kHeaderBytes + size_t(r) * size_t(o_.slot_bytes); }

  // Central barrier with a generation counter; futex sleeps, deadline, and a
  // liveness check of the peers every 100 ms.
  void barrier_now() {
    const uint32_t gen = header_->generation.load();
    if (header_->arrived.fetch_add(1) + 1 == uint32_t(o_.world_size)) {
      header_->arrived.store(0);
      header_->generation.fetch_add(1);
      ::syscall(SYS_futex, &header_->generation, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
      return;
    }
    const Clock::time_point deadline = Clock::now() + o_.timeout;
    for (int spin = 0; header_->generation.load() == gen; ++spin) {
      if (spin < 200) {
        __builtin_ia32_pause();
        continue;
      }
      timespec ts{0, 100 * 1000 * 1000};
      ::syscall(SYS_futex, &header_->generation, FUTEX_WAIT, gen, &ts, nullptr, 0);
      if (header_->generation.load() != gen) break;
      for (int r = 0; r < int(peer_fds_.size()); ++r) {
        const int32_t pid = header_->pids[r].load();
        pollfd p{peer_fds_[r], POLLIN, 0};
        if (peer_fds_[r] >= 0 && ::poll(&p, 1, 0) > 0) {
          throw TrainerError("shm communicator: rank " + std::to_string(r) + " (pid " +
                             std::to_string(pid) + ") exited during a collective");
        }
      }
      if (Clock::now() > deadline) {
        throw TrainerError("shm communicator: rank " + std::to_string(o_.rank) +
                           " waited " + std::to_string(o_.timeout.count()) +
                           " ms for the other ranks");
      }
    }
  }

  // Rank r sums portion r of the chunk over every slot, in rank order, so
  // the result's bits do not depend on which rank summed them.
  template <typename T>
  void sum_portion(int64_t chunk_elems) {
    const int64_t per = (chunk_elems + o_.world_size - 1) / o_.world_size;
    const int64_t begin = std::min(chunk_elems, per * o_.rank);
    const int64_t end = std::min(chunk_elems, begin + per);
    T* out = reinterpret_cast<T*>(slot(o_.rank));
    const T* s0 = reinterpret_cast<const T*>(slot(0));
    for (int64_t i = begin; i < end; ++i) {
      T acc = s0[i];
      for (int r = 1; r < o_.world_size; ++r) acc += reinterpret_cast<const T*>(slot(r))[i];
      out[i] = acc;
    }
  }

  void allreduce_now(at::Tensor t) {
    const int64_t esize = t.element_size();
    const int64_t chunk_cap = o_.slot_bytes / esize;
    const int64_t n = t.numel();
    uint8_t* data = static_cast<uint8_t*>(t.data_ptr());
    const int64_t w = o_.world_size;
    for (int64_t off = 0; off < n; off += chunk_cap) {
      const int64_t m = std::min(chunk_cap, n - off);
      std::memcpy(slot(o_.rank), data + off * esize, size_t(m * esize));
      barrier_now();
      switch (t.scalar_type()) {
        case at::kFloat: sum_portion<float>(m); break;
        case at::kDouble: sum_portion<double>(m); break;
        case at::kLong: sum_portion<int64_t>(m); break;
        case at::kInt: sum_portion<int32_t>(m); break;
        default:
          throw TrainerError(std::string("shm communicator: cannot sum ") +
                             c10::toString(t.scalar_type()));
      }
      barrier_now();
      const int64_t per = (m + w - 1) / w;
      for (int r = 0; r < w; ++r) {
        const int64_t begin = std::min(m, per * r);
        const int64_t end = std::min(m, begin + per);
        if (end > begin) {
          std::memcpy(data + (off + begin) * esize, slot(r) + begin * esize,
                      size_t((end - begin) * esize));
        }
      }
      barrier_now();  // slots are free again
    }
  }

  void broadcast_now(at::Tensor t, int root) {
    const int64_t bytes = t.numel() * t.element_size();
    uint8_t* data = static_cast<uint8_t*>(t.data_ptr());
    for (int64_t off = 0; off < bytes; off += o_.slot_bytes) {
      const int64_t m = std::min<int64_t>(o_.slot_bytes, bytes - off);
      if (o_.rank == root) std::memcpy(slot(root), data + off, size_t(m));
      barrier_now();
      if (o_.rank != root) std::memcpy(data + off, slot(root), size_t(m));
      barrier_now();
    }
  }

  ShmOptions o_;
  int fd_ = -1;
  size_t bytes_ = 0;
  uint8_t* base_ = nullptr;
  Header* header_ = nullptr;
  std::vector<int> peer_fds_;  // pidfd per peer rank, -1 for ourselves

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  std::thread worker_;
};

}  // namespace

std::unique_ptr<Communicator> make_shm_communicator(c10d::Store& store, const ShmOptions& options) {
  return std::make_unique<ShmCommunicator>(store, options);
}

}  // namespace ddprun::trainer
