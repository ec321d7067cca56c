#include "base/queued_writer.h"

#include <errno.h>

#include <algorithm>
#include <deque>
#include <exception>
#include <mutex>
#include <vector>

#include "base/mutex.h"

namespace ddprun::base {
namespace queued_writer_detail {

// Once added, the fields from `pending` on are guarded by its State's
// `mu`: not annotated, as a File cannot name another object's mutex.
struct File {
  ScopedFd fd;  // touched by the writer thread only, once added
  std::string name;
  std::function<std::string(size_t)> notice;
  std::string pending;      // queued, not yet taken by the thread
  size_t in_flight = 0;     // being written now
  size_t written = 0;
  size_t dropped = 0;       // in all
  size_t dropped_run = 0;   // since the last notice
  bool dropping = false;    // until the queue has drained: then the notice
  bool in_ready = false;    // in State::ready
  bool writing = false;     // the thread has its bytes
  bool released = false;    // the handle is gone: close once drained
  int error = 0;
  std::string unwritten;    // after error: what the file did not take
};

struct Job {
  std::string name;
  size_t bytes = 0;
  std::function<void()> fn;
};

struct State {
  size_t max_queued = 0;
  std::function<void(const std::string&)> on_error;
  Mutex mu;
  CondVar wake;  // the thread: work queued, or stop
  CondVar idle;  // flush(): a write or a job finished
  std::deque<std::shared_ptr<File>> ready GUARDED_BY(mu);  // files with bytes (or a close) to do
  std::vector<std::shared_ptr<File>> files GUARDED_BY(mu);  // every file not yet closed
  std::deque<Job> jobs GUARDED_BY(mu);
  size_t job_bytes GUARDED_BY(mu) = 0;
  std::string running_job GUARDED_BY(mu);  // its name while one runs
  bool job_running GUARDED_BY(mu) = false;
  File* writing GUARDED_BY(mu) = nullptr;
  bool stop GUARDED_BY(mu) = false;     // close(): nothing more is taken
  bool abandon GUARDED_BY(mu) = false;  // close() past its deadline: the thread leaves

  bool drained() const REQUIRES(mu) {
    return ready.empty() && jobs.empty() && !job_running && !writing;
  }
  // Queue `f` for the thread unless it is queued or being written.
  void make_ready(const std::shared_ptr<File>& f) REQUIRES(mu) {
    if (f->in_ready || f->writing) return;
    f->in_ready = true;
    ready.push_back(f);
    wake.notify_one();
  }
};

}  // namespace queued_writer_detail

using queued_writer_detail::File;
using queued_writer_detail::State;

// --- QueuedFile ----------------------------------------------------------

QueuedFile::~QueuedFile() { release(); }

QueuedFile::QueuedFile(QueuedFile&& other) noexcept
    : state_(std::move(other.state_)), file_(std::move(other.file_)) {}

QueuedFile& QueuedFile::operator=(QueuedFile&& other) noexcept {
  if (this != &other) {
    release();
    state_ = std::move(other.state_);
    file_ = std::move(other.file_);
  }
  return *this;
}

void QueuedFile::release() {
  if (!file_) return;
  {
    MutexLock lk(state_->mu);
    file_->released = true;
    if (!state_->stop) state_->make_ready(file_);  // the thread closes it
  }
  file_.reset();
  state_.reset();
}

void QueuedFile::write(std::string_view bytes) {
  if (!file_ || bytes.empty()) return;
  MutexLock lk(state_->mu);
  File& f = *file_;
  if (f.error) return;
  if (state_->stop || f.dropping ||
      f.pending.size() + f.in_flight + bytes.size() > state_->max_queued) {
    f.dropped += bytes.size();
    f.dropped_run += bytes.size();
    if (state_->stop) return;
    if (!f.dropping && f.pending.empty() && !f.writing) {
      // Nothing queued to drain first (one chunk past the bound alone):
      // the notice goes at once.
      f.pending = f.notice(f.dropped_run);
      f.dropped_run = 0;
      state_->make_ready(file_);
      return;
    }
    f.dropping = true;
    return;
  }
  f.pending.append(bytes.data(), bytes.size());
  state_->make_ready(file_);
}

int QueuedFile::error() const {
  if (!file_) return 0;
  MutexLock lk(state_->mu);
  return file_->error;
}

std::string QueuedFile::take_unwritten() {
  if (!file_) return "";
  MutexLock lk(state_->mu);
  return std::move(file_->unwritten);
}

size_t QueuedFile::queued() const {
  if (!file_) return 0;
  MutexLock lk(state_->mu);
  return file_->pending.size() + file_->in_flight;
}

size_t QueuedFile::written() const {
  if (!file_) return 0;
  MutexLock lk(state_->mu);
  return file_->written;
}

size_t QueuedFile::dropped() const {
  if (!file_) return 0;
  MutexLock lk(state_->mu);
  return file_->dropped;
}

const std::string& QueuedFile::name() const {
  static const std::string none;
  return file_ ? file_->name : none;  // set once, before the handle exists
}

// --- QueuedWriter --------------------------------------------------------

std::string QueuedWriter::drop_notice(size_t dropped, const std::string& name) {
  return "ddprun: " + std::to_string(dropped) + " bytes dropped: " + name +
         " did not keep up\n";
}

QueuedWriter::QueuedWriter() : QueuedWriter(Options{}) {}

QueuedWriter::QueuedWriter(Options options)
    : options_(std::move(options)), state_(std::make_shared<State>()) {
  state_->max_queued = options_.max_queued;
  state_->on_error = options_.on_error;
}

void QueuedWriter::start_thread() {
  std::call_once(started_, [this] { thread_ = std::thread(thread_main, state_); });
}

QueuedWriter::~QueuedWriter() {
  if (closed_) return;
  const std::string left = close(std::chrono::steady_clock::now() + options_.close_wait);
  if (!left.empty() && options_.on_error) options_.on_error(left);
}

QueuedFile QueuedWriter::add(ScopedFd fd, std::string name,
                             std::function<std::string(size_t)> notice) {
  start_thread();
  auto f = std::make_shared<File>();
  f->fd = std::move(fd);
  if (!notice) notice = [n = name](size_t dropped) { return drop_notice(dropped, n); };
  f->name = std::move(name);
  f->notice = std::move(notice);
  MutexLock lk(state_->mu);
  if (!state_->stop) state_->files.push_back(f);
  return QueuedFile(state_, std::move(f));
}

bool QueuedWriter::run(std::string name, size_t bytes, std::function<void()> job) {
  start_thread();
  MutexLock lk(state_->mu);
  if (state_->stop || state_->job_bytes + bytes > state_->max_queued) {
    lk.unlock();
    if (options_.on_error) options_.on_error("not written: " + name + " (its writer did not keep up)");
    return false;
  }
  state_->job_bytes += bytes;
  state_->jobs.push_back({std::move(name), bytes, std::move(job)});
  state_->wake.notify_one();
  return true;
}

bool QueuedWriter::flush(std::chrono::steady_clock::time_point deadline) {
  MutexLock lk(state_->mu);
  while (!state_->drained()) {
    if (!state_->idle.wait_until(state_->mu, deadline)) return state_->drained();
  }
  return true;
}

std::string QueuedWriter::close(std::chrono::steady_clock::time_point deadline) {
  if (closed_) return "";
  closed_ = true;
  // Never started: nothing was ever queued, and nothing will be.
  std::call_once(started_, [] {});
  if (!thread_.joinable()) {
    MutexLock lk(state_->mu);
    state_->stop = true;
    return "";
  }
  (void)flush(deadline);
  std::string left;
  {
    MutexLock lk(state_->mu);
    state_->stop = true;  // nothing more comes: drained() is final, or the thread is busy
    if (!state_->drained()) {
      state_->abandon = true;
      for (const auto& f : state_->files) {
        const size_t n = f->pending.size() + f->in_flight;
        if (n == 0) continue;
        left += (left.empty() ? "" : ", ") + std::to_string(n) + " bytes for " + f->name;
      }
      const size_t jobs = state_->jobs.size() + (state_->job_running ? 1 : 0);
      if (jobs > 0) {
        left += (left.empty() ? "" : ", ") + std::to_string(jobs) + " file(s) (";
        bool first = true;
        if (state_->job_running) left += state_->running_job, first = false;
        for (const auto& j : state_->jobs) left += (first ? "" : ", ") + j.name, first = false;
        left += ")";
      }
      if (left.empty()) left = "the close of a file";
    }
    state_->wake.notify_one();
  }
  if (left.empty()) {
    thread_.join();  // drained and stopped: it leaves at once
    return "";
  }
  // Stuck in a write: it owns its share of the state and ends with us.
  thread_.detach();
  return "not written (the files did not take them in time): " + left;
}

void QueuedWriter::thread_main(std::shared_ptr<State> s) {
  std::string batch;
  MutexLock lk(s->mu);
  for (;;) {
    while (!(s->abandon || s->stop || !s->ready.empty() || !s->jobs.empty())) s->wake.wait(s->mu);
    if (s->abandon) return;
    if (!s->jobs.empty()) {
      queued_writer_detail::Job job = std::move(s->jobs.front());
      s->jobs.pop_front();
      s->job_running = true;
      s->running_job = job.name;
      lk.unlock();
      std::string failed;
      try {
        job.fn();
      } catch (const std::exception& e) {
        failed = e.what();
      }
      if (!failed.empty() && s->on_error) s->on_error("cannot write " + job.name + ": " + failed);
      lk.lock();
      s->job_running = false;
      s->job_bytes -= job.bytes;
      s->idle.notify_all();
      continue;
    }
    if (s->ready.empty()) {
      if (s->stop) return;  // stop with nothing left
      continue;
    }
    std::shared_ptr<File> f = std::move(s->ready.front());
    s->ready.pop_front();
    f->in_ready = false;
    if (f->pending.empty()) {
      if (f->released) {
        // Drained and given up by its owner: closed here, not on the
        // owner's thread (a close on NFS may wait too).
        ScopedFd fd = std::move(f->fd);
        s->files.erase(std::remove(s->files.begin(), s->files.end(), f), s->files.end());
        lk.unlock();
        fd.reset();
        lk.lock();
      }
      s->idle.notify_all();
      continue;
    }
    batch.clear();
    batch.swap(f->pending);
    f->in_flight = batch.size();
    f->writing = true;
    s->writing = f.get();
    const int fd = f->fd.get();
    lk.unlock();
    const bool ok = write_fully(fd, batch.data(), batch.size());
    const int err = errno;
    lk.lock();
    f->in_flight = 0;
    f->writing = false;
    s->writing = nullptr;
    if (s->abandon) return;
    if (ok) {
      f->written += batch.size();
      // Caught up after a gap: the notice takes the dropped bytes' place.
      if (f->pending.empty() && f->dropping) {
        f->pending = f->notice(f->dropped_run);
        f->dropped_run = 0;
        f->dropping = false;
      }
    } else {
      f->error = err ? err : EIO;
      f->unwritten = std::move(batch);
      f->unwritten += f->pending;
      f->pending.clear();
      f->dropping = false;
    }
    if (!f->pending.empty() || f->released) s->make_ready(f);
    s->idle.notify_all();
  }
}

}  // namespace ddprun::base
