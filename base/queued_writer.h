// QueuedWriter: files the agent's event loop writes (worker logs,
// events.jsonl, agent.log, hang reports), written by a thread of their own,
// so a file that stops taking bytes (a stalled NFS log folder, a full disk
// that hangs, a FIFO nobody reads) stalls that thread, never the caller.
//
// Each file is a QueuedFile (add()): write() appends a chunk to its queue
// and returns at once; the thread writes each file's chunks in order, one
// file after another. Memory is bounded per file (Options::max_queued):
// a chunk that would pass the bound is not queued but counted, and so is
// every chunk after it until the file has written what it holds; then one
// notice line takes the dropped bytes' place in the file ("ddprun: 123
// bytes dropped: <file> did not keep up"), so a reader sees where the gap
// is, and chunks are queued again. A chunk is queued or dropped whole.
//
// Whole-file writes (run()) are jobs on the same thread, in the order they
// were queued: a hang report written twice ends as the second.
//
// A file whose write fails (EIO, ENOSPC) takes nothing more: error() says
// why, for the owner to report (the thread does not log: base has no
// logger; Options::on_error hears the jobs' failures).
//
// close() (the destructor too) waits, up to a deadline, for what is queued,
// then stops the thread; past the deadline it says what was not written and
// leaves the thread, stuck in its write, to end with the process: it holds
// its own share of the state, never the QueuedWriter's.
//
// The thread starts with the first add() or run().
//
// Thread safety: every method on any thread.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "base/scoped_fd.h"

namespace ddprun::base {

namespace queued_writer_detail {
struct State;
struct File;
}  // namespace queued_writer_detail

// One file's queue. Move-only; its destructor lets the thread close the
// descriptor once the queued chunks are written (or dropped at close()).
class QueuedFile {
 public:
  QueuedFile() = default;
  ~QueuedFile();
  QueuedFile(QueuedFile&&) noexcept;
  QueuedFile& operator=(QueuedFile&&) noexcept;
  QueuedFile(const QueuedFile&) = delete;
  QueuedFile& operator=(const QueuedFile&) = delete;

  bool valid() const { return file_ != nullptr; }
  explicit operator bool() const { return valid(); }
  // Queues `bytes` (copied), or counts them as dropped; never waits for the
  // file. Nothing is queued once the file failed.
  void write(std::string_view bytes);
  // errno of the write that failed (nothing more is written then); 0 while
  // the file takes its bytes.
  int error() const;
  // After error(): the bytes the file did not take (the failed write's whole
  // chunk, so its start may be in the file too, and what was queued behind
  // it), for the owner to show elsewhere; each byte is handed out once.
  std::string take_unwritten();
  // Bytes queued or being written now.
  size_t queued() const;
  // Bytes written to the file so far (notices included).
  size_t written() const;
  // Bytes dropped so far because the file did not keep up.
  size_t dropped() const;
  const std::string& name() const;

 private:
  friend class QueuedWriter;
  QueuedFile(std::shared_ptr<queued_writer_detail::State> state,
             std::shared_ptr<queued_writer_detail::File> file)
      : state_(std::move(state)), file_(std::move(file)) {}
  void release();
  std::shared_ptr<queued_writer_detail::State> state_;
  std::shared_ptr<queued_writer_detail::File> file_;
};

class QueuedWriter {
 public:
  struct Options {
    // Bytes one file may have queued (and a job its bytes): past it, what
    // comes is counted, not kept, until the file has caught up.
    size_t max_queued = size_t(4) << 20;
    // How long the destructor waits for what is queued (close()).
    std::chrono::milliseconds close_wait{5000};
    // Hears one line when a job throws or is dropped (on the writer
    // thread) and what the destructor left unwritten (on its caller's);
    // must be thread-safe (spdlog is). Empty: nobody is told.
    std::function<void(const std::string&)> on_error;
  };
  // The notice written where `dropped` bytes of `name` were left out.
  static std::string drop_notice(size_t dropped, const std::string& name);

  QueuedWriter();  // default Options
  explicit QueuedWriter(Options options);
  // close(now + close_wait); what it left unwritten goes to on_error.
  ~QueuedWriter();
  QueuedWriter(const QueuedWriter&) = delete;
  QueuedWriter& operator=(const QueuedWriter&) = delete;

  // Takes `fd` (a file opened by the caller, through SafeDir); `name` names
  // it in the notice and messages. `notice` makes the line that marks a gap
  // (drop_notice() when empty; a JSON-lines file gives a JSON line).
  QueuedFile add(ScopedFd fd, std::string name,
                 std::function<std::string(size_t dropped)> notice = {});
  // Runs `job` on the writer thread after the jobs queued before it
  // (SafeDir::write_atomically of a report). `bytes`: what it holds, counted
  // against max_queued while queued. A job that throws is reported through
  // on_error with `name`; one that would pass the bound is dropped (false).
  bool run(std::string name, size_t bytes, std::function<void()> job);
  // Waits until everything queued is written, or `deadline`; true when it
  // all was. The thread goes on.
  bool flush(std::chrono::steady_clock::time_point deadline);
  // flush(deadline), then stops the thread. "" when everything was written,
  // otherwise one line of what was not ("12 bytes for a.log, 1 job
  // (hang_report.json)"). Later writes are dropped. Idempotent.
  std::string close(std::chrono::steady_clock::time_point deadline);

 private:
  static void thread_main(std::shared_ptr<queued_writer_detail::State> state);
  // Starts the thread on the first add() or run(): an agent whose workers
  // log to no file never makes it, and one that does makes it after its
  // first workers are started, not before them.
  void start_thread();
  Options options_;
  std::shared_ptr<queued_writer_detail::State> state_;
  std::once_flag started_;  // the thread started, or close() came first
  std::thread thread_;
  bool closed_ = false;
};

}  // namespace ddprun::base
