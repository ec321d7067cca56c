#include "agent/console.h"

#include <errno.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>

#include <boost/asio/post.hpp>

#include "agent/live_region.h"

namespace ddprun::agent {

struct Console::Queue {
  explicit Queue(boost::asio::io_context& io) : io(io) {}
  boost::asio::io_context& io;
  mutable std::mutex mu;
  std::condition_variable wake;     // writer: bytes queued or stop
  std::condition_variable drained;  // drain_until: queue emptied or failed
  std::string pending;              // appended by the loop, swapped out by the writer
  size_t in_flight = 0;             // bytes the writer is writing now
  size_t written = 0;
  bool stop = false;
  bool failed = false;              // the console is gone (EPIPE, EIO): discard
  // The source whose line is open (write_line() from other threads ends it
  // too, so it lives under mu) and the one a typed line ended.
  const void* open = nullptr;
  const void* typed_over = nullptr;
  std::vector<std::function<void()>> waiting;  // resumes, run on the loop
  LiveRegion live;  // terminal only: the progress bars' lines
};

namespace {

// Writes all of `data`; false when the console is gone. A descriptor that
// someone else made non-blocking (it is shared with the shell) is waited
// on with poll instead of spun on.
bool write_fully(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd p{fd, POLLOUT, 0};
        (void)::poll(&p, 1, -1);
        continue;
      }
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

Console::Console(boost::asio::io_context& io, int fd, bool terminal)
    : io_(io), fd_(fd), terminal_(terminal), q_(std::make_shared<Queue>(io)) {
  writer_ = std::thread(writer_main, q_, fd);
}

Console::~Console() {
  {
    std::lock_guard<std::mutex> lk(q_->mu);
    q_->stop = true;
    // A writer left stuck below must never post a resume to the loop,
    // which goes away with the agent (TSan: SEGV in post() at exit once
    // a stalled console took its bytes).
    q_->waiting.clear();
  }
  q_->wake.notify_one();
  // A writer stuck in write() on a stalled console would hold the exit
  // forever: leave it; it owns its share of the queue and dies with us.
  if (bytes_queued() == 0)
    writer_.join();
  else
    writer_.detach();
}

void Console::writer_main(std::shared_ptr<Queue> q, int fd) {
  std::string batch;
  std::unique_lock<std::mutex> lk(q->mu);
  for (;;) {
    q->wake.wait(lk, [&] { return !q->pending.empty() || q->stop; });
    if (q->pending.empty()) return;  // stopping, nothing left
    batch.clear();
    batch.swap(q->pending);
    q->in_flight = batch.size();
    bool ok = !q->failed;
    lk.unlock();
    if (ok) ok = write_fully(fd, batch.data(), batch.size());
    lk.lock();
    if (!ok) q->failed = true;
    q->written += q->in_flight;
    q->in_flight = 0;
    if (!q->waiting.empty() && (q->failed || q->pending.size() < kHighWater / 2)) {
      auto resumes = std::move(q->waiting);
      q->waiting.clear();
      boost::asio::post(q->io, [resumes = std::move(resumes)] {
        for (auto& r : resumes) r();
      });
    }
    if (q->pending.empty()) q->drained.notify_all();
  }
}

void Console::write(const void* source, std::string_view bytes, bool leaves_line_open) {
  if (bytes.empty()) return;
  bool was_empty;
  {
    std::lock_guard<std::mutex> lk(q_->mu);
    if (q_->failed) {
      q_->open = nullptr;
      return;
    }
    was_empty = q_->pending.empty();
    // Another source's line is open: end it, so lines never mix.
    if (q_->open && q_->open != source) q_->pending += '\n';
    if (terminal_ && (!q_->live.empty() || bytes.find('\r') != std::string_view::npos)) {
      winsize size{};
      if (ioctl(fd_, TIOCGWINSZ, &size) == 0) q_->live.set_width(size.ws_col);
      bool open = q_->live.write(source, bytes, q_->open != source, q_->pending);
      q_->open = open && leaves_line_open ? source : nullptr;
    } else {
      q_->pending.append(bytes.data(), bytes.size());
      q_->open = leaves_line_open ? source : nullptr;
    }
    if (source != q_->typed_over) q_->typed_over = nullptr;
  }
  if (was_empty) q_->wake.notify_one();
}

bool Console::write_line(std::string_view line) {
  bool was_empty;
  {
    std::lock_guard<std::mutex> lk(q_->mu);
    if (q_->failed) return false;
    if (q_->pending.size() + q_->in_flight + line.size() > kHighWater + kLogRoom) return false;
    was_empty = q_->pending.empty();
    if (q_->open) q_->pending += '\n';
    if (q_->live.empty())
      q_->pending.append(line.data(), line.size());
    else
      (void)q_->live.write(nullptr, line, true, q_->pending);  // above the bars
    q_->open = nullptr;
    // typed_over stays: the typed line ended its owner's line, and ddprun's
    // own line after it (the input's new rank) continues nothing of it.
  }
  if (was_empty) q_->wake.notify_one();
  return true;
}

const void* Console::open_line() const {
  std::lock_guard<std::mutex> lk(q_->mu);
  return q_->open;
}

bool Console::holds_line(const void* source) const {
  std::lock_guard<std::mutex> lk(q_->mu);
  return q_->open == source || q_->live.holds(source);
}

void Console::write_untouched(std::string_view bytes) {
  if (bytes.empty()) return;
  bool was_empty;
  {
    std::lock_guard<std::mutex> lk(q_->mu);
    if (q_->failed) return;
    was_empty = q_->pending.empty();
    q_->pending.append(bytes.data(), bytes.size());
    q_->open = nullptr;
  }
  if (was_empty) q_->wake.notify_one();
}

void Console::line_typed() {
  std::lock_guard<std::mutex> lk(q_->mu);
  if (q_->open) q_->typed_over = q_->open;
  q_->open = nullptr;
  q_->live.cursor_moved();
}

bool Console::take_typed_over(const void* source) {
  std::lock_guard<std::mutex> lk(q_->mu);
  if (q_->typed_over != source) return false;
  q_->typed_over = nullptr;
  return true;
}

bool Console::full() const {
  std::lock_guard<std::mutex> lk(q_->mu);
  return !q_->failed && q_->pending.size() + q_->in_flight >= kHighWater;
}

void Console::when_room(std::function<void()> resume) {
  std::lock_guard<std::mutex> lk(q_->mu);
  if (q_->failed || q_->pending.size() < kHighWater / 2) {
    boost::asio::post(io_, std::move(resume));
    return;
  }
  q_->waiting.push_back(std::move(resume));
}

bool Console::drain_until(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lk(q_->mu);
  auto idle = [&] { return q_->failed || (q_->pending.empty() && q_->in_flight == 0); };
  while (!idle()) {
    // The writer notifies when it has emptied the queue; in_flight turns 0
    // just after, so wake up now and then to see it.
    if (q_->drained.wait_until(lk, std::min(deadline, std::chrono::steady_clock::now() +
                                                          std::chrono::milliseconds(20))) ==
            std::cv_status::timeout &&
        std::chrono::steady_clock::now() >= deadline)
      break;
  }
  return idle();
}

size_t Console::bytes_queued() const {
  std::lock_guard<std::mutex> lk(q_->mu);
  return q_->failed ? 0 : q_->pending.size() + q_->in_flight;
}

size_t Console::bytes_written() const {
  std::lock_guard<std::mutex> lk(q_->mu);
  return q_->written;
}

Consoles open_consoles(boost::asio::io_context& io, int out_fd, int err_fd) {
  Consoles c;
  c.out = std::make_shared<Console>(io, out_fd, isatty(out_fd) == 1);
  struct stat a, b;
  bool same = fstat(out_fd, &a) == 0 && fstat(err_fd, &b) == 0 && a.st_dev == b.st_dev &&
              a.st_ino == b.st_ino && a.st_rdev == b.st_rdev;
  c.err = same ? c.out : std::make_shared<Console>(io, err_fd, isatty(err_fd) == 1);
  return c;
}

}  // namespace ddprun::agent
