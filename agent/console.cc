#include "agent/console.h"

#include <errno.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mutex>
#include <optional>

#include <boost/asio/post.hpp>

#include "agent/interactive_line.h"
#include "agent/live_region.h"
#include "base/mutex.h"

namespace ddprun::agent {

struct Console::Queue {
  explicit Queue(boost::asio::io_context& io) : io(io) {}
  boost::asio::io_context& io;
  mutable base::Mutex mu;
  base::CondVar wake;     // writer: bytes queued or stop
  base::CondVar drained;  // drain_until: queue emptied or failed
  std::string pending GUARDED_BY(mu);  // appended by the loop, swapped out by the writer
  size_t in_flight GUARDED_BY(mu) = 0;  // bytes the writer is writing now
  size_t written GUARDED_BY(mu) = 0;
  bool stop GUARDED_BY(mu) = false;
  bool failed GUARDED_BY(mu) = false;  // the console is gone (EPIPE, EIO): discard
  // The source whose line is open (write_line() from other threads ends it
  // too, so it lives under mu) and the one a typed line ended.
  const void* open GUARDED_BY(mu) = nullptr;
  const void* typed_over GUARDED_BY(mu) = nullptr;
  std::vector<std::function<void()>> waiting GUARDED_BY(mu);  // resumes, run on the loop
  LiveRegion live GUARDED_BY(mu);  // terminal only: the progress bars' lines
  // Raw passthrough: the source whose readline has the keyboard, its line,
  // and whether that line is on the screen (the cursor in it, below the
  // bars when they are drawn).
  const void* ia_source GUARDED_BY(mu) = nullptr;
  std::optional<InteractiveLine> ia GUARDED_BY(mu);
  bool ia_shown GUARDED_BY(mu) = false;

  // Everything queued is written (or never will be).
  bool idle() const REQUIRES(mu) { return failed || (pending.empty() && in_flight == 0); }
  // Before other output: the interactive line's row is cleared and the
  // cursor goes where the region (or the next line) expects it.
  void take_down() REQUIRES(mu) {
    if (!ia_source || !ia_shown) return;
    pending += "\r\x1b[K";
    if (live.drawn() > 0) pending += "\x1b[A";  // to the bars' last line
    ia_shown = false;
    if (open == ia_source) open = nullptr;
  }
  // After it: the interactive line drawn again, last on the screen.
  void bring_up() REQUIRES(mu) {
    if (!ia_source || ia_shown) return;
    if (open) {
      pending += '\n';  // another source's prompt line ends above it
      open = nullptr;
    } else if (live.drawn() > 0) {
      pending += '\n';  // below the bars
    }
    ia->replay(pending);
    ia_shown = true;
    open = ia->at_line_start() ? nullptr : ia_source;
  }
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
    : io_(io), fd_(fd), terminal_(terminal), q_(std::make_shared<Queue>(io)) {}

void Console::wake_writer() {
  // The thread starts with the first bytes: a launch that writes nothing
  // before its workers run starts none on their path.
  std::call_once(writer_started_, [this] { writer_ = std::thread(writer_main, q_, fd_); });
  q_->wake.notify_one();
}

Console::~Console() {
  {
    base::MutexLock lk(q_->mu);
    q_->stop = true;
    // A writer left stuck below must never post a resume to the loop,
    // which goes away with the agent (TSan: SEGV in post() at exit once
    // a stalled console took its bytes).
    q_->waiting.clear();
  }
  // Never started (nothing was written): none starts now; the call orders
  // this thread after one that did start it.
  std::call_once(writer_started_, [] {});
  if (!writer_.joinable()) return;
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
  base::MutexLock lk(q->mu);
  for (;;) {
    while (q->pending.empty() && !q->stop) q->wake.wait(q->mu);
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
    base::MutexLock lk(q_->mu);
    if (q_->failed) {
      q_->open = nullptr;
      return;
    }
    was_empty = q_->pending.empty();
    q_->take_down();
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
    q_->bring_up();
  }
  if (was_empty) wake_writer();
}

bool Console::write_line(std::string_view line) {
  bool was_empty;
  {
    base::MutexLock lk(q_->mu);
    if (q_->failed) return false;
    if (q_->pending.size() + q_->in_flight + line.size() > kHighWater + kLogRoom) return false;
    was_empty = q_->pending.empty();
    q_->take_down();
    if (q_->open) q_->pending += '\n';
    if (q_->live.empty())
      q_->pending.append(line.data(), line.size());
    else
      (void)q_->live.write(nullptr, line, true, q_->pending);  // above the bars
    q_->open = nullptr;
    // typed_over stays: the typed line ended its owner's line, and ddprun's
    // own line after it (the input's new rank) continues nothing of it.
    q_->bring_up();
  }
  if (was_empty) wake_writer();
  return true;
}

const void* Console::open_line() const {
  base::MutexLock lk(q_->mu);
  return q_->open;
}

bool Console::holds_line(const void* source) const {
  base::MutexLock lk(q_->mu);
  return q_->open == source || q_->live.holds(source);
}

void Console::write_untouched(std::string_view bytes) {
  if (bytes.empty()) return;
  bool was_empty;
  {
    base::MutexLock lk(q_->mu);
    if (q_->failed) return;
    was_empty = q_->pending.empty();
    q_->pending.append(bytes.data(), bytes.size());
    q_->open = nullptr;
  }
  if (was_empty) wake_writer();
}

void Console::begin_interactive(const void* source, std::string prefix, std::string_view line,
                                std::optional<size_t> shown, const void* companion) {
  bool was_empty;
  {
    base::MutexLock lk(q_->mu);
    was_empty = q_->pending.empty();
    if (q_->ia_source && q_->ia_source != source && q_->ia_shown && q_->open == q_->ia_source) {
      q_->pending += '\n';  // the previous one's prompt stays where it is
      q_->open = nullptr;
    }
    q_->ia.emplace(std::move(prefix));
    q_->ia_source = source;
    if (shown) {
      // On the screen up to `shown`: the rest is new to it.
      size_t n = std::min(*shown, line.size());
      q_->ia->adopt(line.substr(0, n));
      q_->ia_shown = true;
      q_->ia->write(line.substr(n), q_->pending);
      q_->open = q_->ia->at_line_start() ? nullptr : source;
    } else if (line.empty() && companion && q_->open == companion) {
      // The worker's prompt went to its other stream (input() without
      // readline prompts on stderr): the echo continues that line.
      q_->ia->continue_line();
      q_->ia_shown = true;
      q_->open = source;
    } else {
      q_->ia->adopt(line);
      q_->ia_shown = false;
      q_->bring_up();
    }
  }
  if (was_empty) wake_writer();
}

bool Console::write_interactive(const void* source, std::string_view bytes) {
  bool was_empty;
  {
    base::MutexLock lk(q_->mu);
    if (q_->ia_source != source) return false;
    if (q_->failed || bytes.empty()) return true;
    was_empty = q_->pending.empty();
    q_->bring_up();
    size_t nl = bytes.rfind('\n');
    if (q_->live.drawn() > 0 && nl != std::string_view::npos) {
      // Lines the worker completes below the bars go above them: the row
      // cleared, the bars taken down, the finished lines drawn whole from
      // their start, the bars again, and the open rest below them.
      q_->pending += "\r\x1b[K\x1b[A";
      q_->live.hide(q_->pending);
      std::string done = q_->ia->kept();
      done.append(bytes.substr(0, nl + 1));
      InteractiveLine(q_->ia->prefix()).write(done, q_->pending);
      std::string unused;
      q_->ia->write(bytes.substr(0, nl + 1), unused);  // its state after those lines
      q_->live.show(q_->pending);
      q_->pending += '\n';
      q_->ia->write(bytes.substr(nl + 1), q_->pending);
    } else {
      q_->ia->write(bytes, q_->pending);
    }
    q_->ia_shown = true;
    q_->open = q_->ia->at_line_start() ? nullptr : source;
  }
  if (was_empty) wake_writer();
  return true;
}

void Console::end_interactive(const void* source) {
  bool queued = false;
  {
    base::MutexLock lk(q_->mu);
    if (q_->ia_source != source) return;
    if (q_->open == source) {
      q_->pending += '\n';  // a prompt left open (the worker died in it) ends here
      q_->open = nullptr;
      queued = true;
    }
    q_->ia_source = nullptr;
    q_->ia.reset();
    q_->ia_shown = false;
  }
  if (queued) wake_writer();
}

void Console::line_typed() {
  base::MutexLock lk(q_->mu);
  if (q_->open) q_->typed_over = q_->open;
  q_->open = nullptr;
  q_->live.cursor_moved();
}

bool Console::take_typed_over(const void* source) {
  base::MutexLock lk(q_->mu);
  if (q_->typed_over != source) return false;
  q_->typed_over = nullptr;
  return true;
}

bool Console::full() const {
  base::MutexLock lk(q_->mu);
  return !q_->failed && q_->pending.size() + q_->in_flight >= kHighWater;
}

void Console::when_room(std::function<void()> resume) {
  base::MutexLock lk(q_->mu);
  if (q_->failed || q_->pending.size() < kHighWater / 2) {
    boost::asio::post(io_, std::move(resume));
    return;
  }
  q_->waiting.push_back(std::move(resume));
}

bool Console::drain_until(std::chrono::steady_clock::time_point deadline) {
  base::MutexLock lk(q_->mu);
  while (!q_->idle()) {
    // The writer notifies when it has emptied the queue; in_flight turns 0
    // just after, so wake up now and then to see it.
    if (!q_->drained.wait_until(q_->mu, std::min(deadline, std::chrono::steady_clock::now() +
                                                              std::chrono::milliseconds(20))) &&
        std::chrono::steady_clock::now() >= deadline)
      break;
  }
  return q_->idle();
}

size_t Console::bytes_queued() const {
  base::MutexLock lk(q_->mu);
  return q_->failed ? 0 : q_->pending.size() + q_->in_flight;
}

size_t Console::bytes_written() const {
  base::MutexLock lk(q_->mu);
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
