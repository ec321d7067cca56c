#include "trainer/shm_communicator.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <string>

#include <signal.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "base/procfs.h"
#include "base/scoped_fd.h"
#include "base/system_error.h"
#include "trainer/error.h"

namespace ddprun::trainer {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kMaxRanks = 256;
// Slot sets used round-robin: collective c writes set c % kSets, so a rank
// may post collective c+1 while a slower peer still reads collective c.
constexpr uint64_t kSets = 2;

// Progress counters instead of a barrier: posted[r] = collectives whose data
// rank r has written, consumed[r] = collectives rank r has finished reading.
struct Header {
  std::atomic<uint32_t> event;     // bumped after every counter update; the futex word
  std::atomic<uint32_t> sleepers;  // ranks sleeping on `event` (wake only when > 0)
  std::atomic<int32_t> pids[kMaxRanks];
  std::atomic<uint64_t> posted[kMaxRanks];
  std::atomic<uint64_t> consumed[kMaxRanks];
};
constexpr size_t kHeaderBytes = (sizeof(Header) + 4095) / 4096 * 4096;
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

[[noreturn]] void throw_errno(const std::string& what) {
  throw TrainerError("shm communicator: " + what + ": " + base::errno_text(errno));
}

// What rank 0 publishes instead of a segment name ('!' first: a shm name
// starts with '/'), and every rank's ShmNoRoom message.
std::string no_room_message(size_t bytes, int error) {
  struct statvfs fs {};
  std::string free = "?";
  if (::statvfs("/dev/shm", &fs) == 0) free = std::to_string(fs.f_bavail * fs.f_frsize >> 20);
  return "!shm communicator: /dev/shm has " + free + " MiB free, the segment needs " +
         std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB (" + base::errno_text(error) + ")";
}

// Rank `rank` has read rank 0's "no room" decision.
std::string seen_key(const ShmOptions& o, int rank) {
  return o.key_prefix + "shm_no_room_seen/" + std::to_string(rank);
}

template <typename T>
void sum_slots(T* out, const uint8_t* const* slots, int n_slots, int64_t n, T scale) {
  // Slot by slot, in rank order: the same bits as summing each element over
  // ranks 0..W-1, on every rank, and each pass vectorizes. The scale (for a
  // mean) rides on the last pass: the bits of a separate mul_ by `scale`,
  // without another pass over the tensor.
  const T* s0 = reinterpret_cast<const T*>(slots[0]);
  const T* s1 = reinterpret_cast<const T*>(slots[1]);
  if (n_slots == 2 && scale != T(1)) {
    for (int64_t i = 0; i < n; ++i) out[i] = (s0[i] + s1[i]) * scale;
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = s0[i] + s1[i];
  for (int r = 2; r < n_slots; ++r) {
    const T* s = reinterpret_cast<const T*>(slots[r]);
    if (r + 1 == n_slots && scale != T(1)) {
      for (int64_t i = 0; i < n; ++i) out[i] = (out[i] + s[i]) * scale;
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] += s[i];
    }
  }
}

class ShmCommunicator;

class ShmHandle : public CollectiveHandle {
 public:
  ShmHandle(ShmCommunicator* comm, uint64_t seq) : comm_(comm), seq_(seq) {}
  void wait() override;

 private:
  ShmCommunicator* comm_;
  uint64_t seq_;
};

// The segment's name is unlinked once every rank has mapped it, but a rank 0
// killed before that (SIGKILL while waiting for its peers) leaves it in
// /dev/shm. Each new rank 0 removes those whose creator is gone.
void remove_orphaned_segments() {
  const std::string prefix = "ddprun-train-";
  for (const auto& e : base::list_dir_or_empty("/dev/shm")) {
    const std::string& n = e.name;
    if (n.compare(0, prefix.size(), prefix) != 0) continue;
    const long pid = std::strtol(n.c_str() + prefix.size(), nullptr, 10);
    if (pid > 0 && ::kill(pid_t(pid), 0) != 0 && errno == ESRCH) ::shm_unlink(("/" + n).c_str());
  }
}

class ShmCommunicator : public Communicator {
 public:
  ShmCommunicator(c10d::Store& store, const ShmOptions& o) : o_(o) {
    if (o.world_size > kMaxRanks) throw TrainerError("shm communicator: more than 256 ranks");
    bytes_ = kHeaderBytes + kSets * size_t(o.world_size) * size_t(o.slot_bytes);
    const std::string key = o.key_prefix + "shm_name";
    std::string name;
    if (o.rank == 0) {
      remove_orphaned_segments();
      std::random_device rd;
      name = "/ddprun-train-" + std::to_string(::getpid()) + "-" + std::to_string(rd());
      fd_.reset(::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
      if (!fd_) throw_errno("shm_open " + name);
      if (::ftruncate(fd_.get(), off_t(bytes_)) != 0) {
        ::shm_unlink(name.c_str());
        throw_errno("ftruncate " + name + " (is /dev/shm large enough?)");
      }
      if (const int e = ::posix_fallocate(fd_.get(), 0, off_t(bytes_)); e != 0) {
        ::shm_unlink(name.c_str());
        fd_.reset();
        const std::string why = no_room_message(bytes_, e);
        store.set(key, std::vector<uint8_t>(why.begin(), why.end()));  // "!..." : no segment
        // Rank 0 may exit on this (--backend shm), and it often hosts the
        // store: every peer reads the decision first, or it would wait on
        // a store that is gone until its own timeout.
        std::vector<std::string> seen;
        for (int r = 1; r < o.world_size; ++r) seen.push_back(seen_key(o, r));
        try {
          store.wait(seen);
        } catch (const std::exception&) {
          // A peer that never came is its own error; this one's is the room.
        }
        throw ShmNoRoom(why.substr(1));
      }
      store.set(key, std::vector<uint8_t>(name.begin(), name.end()));
    } else {
      std::vector<uint8_t> v = store.get(key);
      name.assign(v.begin(), v.end());
      if (!name.empty() && name[0] == '!') {
        store.set(seen_key(o, o.rank), std::vector<uint8_t>{'1'});
        throw ShmNoRoom(name.substr(1));
      }
      fd_.reset(::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600));
      if (!fd_) throw_errno("shm_open " + name);
    }
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
    if (p == MAP_FAILED) throw_errno("mmap " + name);
    base_ = static_cast<uint8_t*>(p);
    header_ = reinterpret_cast<Header*>(base_);  // zero-filled by ftruncate
    header_->pids[o.rank].store(::getpid());
    barrier();  // every rank has mapped it: the name can go
    if (o.rank == 0) ::shm_unlink(name.c_str());
    // pidfds, not kill(pid, 0): a dead peer its parent has not reaped yet
    // still answers kill(), but its pidfd already polls readable.
    for (int r = 0; r < o.world_size; ++r) {
      const int fd = r == o.rank ? -1 : int(::syscall(SYS_pidfd_open, header_->pids[r].load(), 0));
      peer_fds_.emplace_back(fd);
    }
    barrier();  // no rank leaves before every pidfd is open
  }

  ~ShmCommunicator() override { ::munmap(base_, bytes_); }  // the descriptors close themselves

  int rank() const override { return o_.rank; }
  int world_size() const override { return o_.world_size; }
  std::string backend() const override { return "shm"; }

  // Fits one slot: post it now and return; the sum happens in wait() (or
  // when a later collective needs the slot set), so backward goes on while
  // the peers post theirs. Larger tensors go chunk by chunk, synchronously.
  std::unique_ptr<CollectiveHandle> allreduce_async(at::Tensor& t) override {
    return reduce(t, 1.0);
  }
  std::unique_ptr<CollectiveHandle> allreduce_mean_async(at::Tensor& t) override {
    if (!at::isFloatingType(t.scalar_type())) {
      throw TrainerError("shm communicator: cannot average an integer tensor");
    }
    return reduce(t, 1.0 / o_.world_size);
  }

  std::unique_ptr<CollectiveHandle> reduce(at::Tensor& t, double scale) {
    check(t);
    const int64_t bytes = t.numel() * int64_t(t.element_size());
    if (bytes <= o_.slot_bytes) {
      const uint64_t seq = post(t.data_ptr(), bytes);
      pending_.push_back(Pending{seq, t, 0, t.numel(), scale});
      return std::make_unique<ShmHandle>(this, seq);
    }
    complete_through(next_seq_);
    const int64_t chunk = o_.slot_bytes / int64_t(t.element_size());
    for (int64_t off = 0; off < t.numel(); off += chunk) {
      const int64_t m = std::min(chunk, t.numel() - off);
      const uint64_t seq = post(static_cast<uint8_t*>(t.data_ptr()) + off * t.element_size(),
                                m * int64_t(t.element_size()));
      pending_.push_back(Pending{seq, t, off, m, scale});
      complete_through(seq);
    }
    return std::make_unique<ShmHandle>(this, next_seq_ - 1);
  }

  void broadcast(at::Tensor& t, int root) override {
    check(t);
    complete_through(next_seq_);
    const int64_t bytes = t.numel() * int64_t(t.element_size());
    uint8_t* data = static_cast<uint8_t*>(t.data_ptr());
    for (int64_t off = 0; off < bytes; off += o_.slot_bytes) {
      const int64_t m = std::min<int64_t>(o_.slot_bytes, bytes - off);
      const uint64_t seq = post(o_.rank == root ? data + off : nullptr, m);
      wait_posted(seq);
      if (o_.rank != root) std::memcpy(data + off, slot(seq, root), size_t(m));
      mark_consumed(seq);
    }
  }

  // A collective without data: every rank posts, then waits for all posts.
  void barrier() override {
    complete_through(next_seq_);
    const uint64_t seq = post(nullptr, 0);
    wait_posted(seq);
    mark_consumed(seq);
  }

  // Completes every pending all-reduce up to and including `seq`, oldest
  // first (consumed[] is a count, so completion must go in order).
  void complete_through(uint64_t seq) {
    while (!pending_.empty() && pending_.front().seq <= seq) {
      Pending p = std::move(pending_.front());
      pending_.pop_front();
      wait_posted(p.seq);
      const uint8_t* slots[kMaxRanks];
      for (int r = 0; r < o_.world_size; ++r) slots[r] = slot(p.seq, r);
      uint8_t* out = static_cast<uint8_t*>(p.tensor.data_ptr()) + p.offset * p.tensor.element_size();
      const int w = o_.world_size;
      if (w == 1) {
        // Own data is already in place, and the mean of one is itself.
      } else if (p.tensor.scalar_type() == at::kFloat) {
        sum_slots(reinterpret_cast<float*>(out), slots, w, p.count, float(p.scale));
      } else if (p.tensor.scalar_type() == at::kDouble) {
        sum_slots(reinterpret_cast<double*>(out), slots, w, p.count, p.scale);
      } else if (p.tensor.scalar_type() == at::kLong) {
        sum_slots(reinterpret_cast<int64_t*>(out), slots, w, p.count, int64_t(1));
      } else if (p.tensor.scalar_type() == at::kInt) {
        sum_slots(reinterpret_cast<int32_t*>(out), slots, w, p.count, int32_t(1));
      } else {
        throw TrainerError(std::string("shm communicator: cannot sum ") +
                           c10::toString(p.tensor.scalar_type()));
      }
      mark_consumed(p.seq);
    }
  }

 private:
  struct Pending {
    uint64_t seq;
    at::Tensor tensor;  // keeps the storage alive until the sum is written
    int64_t offset;     // elements
    int64_t count;
    double scale;       // 1 for a sum, 1/world_size for a mean
  };

  void check(const at::Tensor& t) const {
    if (!t.device().is_cpu() || !t.is_contiguous()) {
      throw TrainerError("shm communicator: tensors must be contiguous CPU tensors");
    }
  }

  uint8_t* slot(uint64_t seq, int r) const {
    return base_ + kHeaderBytes +
           (size_t(seq % kSets) * size_t(o_.world_size) + size_t(r)) * size_t(o_.slot_bytes);
  }

  // Writes this rank's part of collective next_seq_ into its slot. The slot
  // set was last used kSets collectives ago: our own read of it is finished
  // first, then every peer's.
  uint64_t post(const void* data, int64_t bytes) {
    const uint64_t seq = next_seq_++;
    if (seq >= kSets) {
      complete_through(seq - kSets);
      const uint64_t need = seq - kSets + 1;
      wait_until([&] { return all_at_least(header_->consumed, need); });
    }
    if (bytes > 0 && data != nullptr) std::memcpy(slot(seq, o_.rank), data, size_t(bytes));
    header_->posted[o_.rank].store(seq + 1);
    notify();
    return seq;
  }

  void wait_posted(uint64_t seq) {
    wait_until([&] { return all_at_least(header_->posted, seq + 1); });
  }

  void mark_consumed(uint64_t seq) {
    header_->consumed[o_.rank].store(seq + 1);
    notify();
  }

  bool all_at_least(const std::atomic<uint64_t>* counters, uint64_t need) const {
    for (int r = 0; r < o_.world_size; ++r) {
      if (counters[r].load() < need) return false;
    }
    return true;
  }

  void notify() {
    header_->event.fetch_add(1);
    if (header_->sleepers.load() > 0) {
      ::syscall(SYS_futex, &header_->event, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
    }
  }

  // Spins for o_.spin (a peer on the other core usually arrives within
  // microseconds), then sleeps on the futex so a waiting rank leaves its core
  // to others. Wakes every 100 ms (2 ms with an AbortSource) to check the
  // peers are alive, the abort source and the deadline. (seq_cst atomics: a notify() either changes `event` before we
  // sleep, so FUTEX_WAIT returns at once, or sees our sleepers count.)
  template <typename Pred>
  void wait_until(Pred ready) {
    if (!error_.empty()) throw TrainerError(error_);  // broken: fail at once, not after the deadline
    if (ready()) return;
    const Clock::time_point start = Clock::now();
    while (Clock::now() - start < o_.spin) {
      for (int i = 0; i < 16; ++i) __builtin_ia32_pause();
      if (ready()) return;
    }
    const Clock::time_point deadline = start + o_.timeout;
    for (;;) {
      header_->sleepers.fetch_add(1);
      const uint32_t ev = header_->event.load();
      if (ready()) {
        header_->sleepers.fetch_sub(1);
        return;
      }
      // Rank scope: a failure must end the wait within milliseconds, and the
      // recovery channel cannot share a futex; group scope keeps its 100 ms.
      timespec ts{0, o_.abort != nullptr ? 2 * 1000 * 1000 : 100 * 1000 * 1000};
      ::syscall(SYS_futex, &header_->event, FUTEX_WAIT, ev, &ts, nullptr, 0);
      header_->sleepers.fetch_sub(1);
      if (ready()) return;
      check_peers(deadline);
    }
  }

  void check_peers(Clock::time_point deadline) {
    for (int r = 0; r < int(peer_fds_.size()); ++r) {
      pollfd p{peer_fds_[r].get(), POLLIN, 0};
      if (peer_fds_[r] && ::poll(&p, 1, 0) > 0) {
        error_ = "shm communicator: rank " + std::to_string(r) + " (pid " +
                 std::to_string(header_->pids[r].load()) + ") exited during a collective";
        throw TrainerError(error_);
      }
    }
    if (o_.abort != nullptr && o_.abort->requested()) {
      error_ = "shm communicator: rank " + std::to_string(o_.rank) +
               " abandoned the collective (a peer failed)";
      throw CollectiveAborted(error_);
    }
    if (Clock::now() > deadline) {
      error_ = "shm communicator: rank " + std::to_string(o_.rank) + " waited " +
               std::to_string(o_.timeout.count()) + " ms for the other ranks";
      throw TrainerError(error_);
    }
  }

  ShmOptions o_;
  base::ScopedFd fd_;
  size_t bytes_ = 0;
  uint8_t* base_ = nullptr;
  Header* header_ = nullptr;
  std::vector<base::ScopedFd> peer_fds_;  // pidfd per peer rank, none for ourselves
  uint64_t next_seq_ = 0;      // collectives issued; the same on every rank
  std::deque<Pending> pending_;  // posted all-reduces not yet summed, oldest first
  std::string error_;            // set once a wait failed; later calls fail with it
};

void ShmHandle::wait() { comm_->complete_through(seq_); }

}  // namespace

std::unique_ptr<Communicator> make_shm_communicator(c10d::Store& store, const ShmOptions& options) {
  return std::make_unique<ShmCommunicator>(store, options);
}

}  // namespace ddprun::trainer
