#include "agent/stdin_forwarder.h"

#include <errno.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <system_error>

#include "base/procfs.h"
#include "base/scoped_fd.h"

namespace ddprun::agent {
namespace {

int reopen(int fd) {
  // /proc/self/fd/N opens the terminal device again: a description of our own.
  std::string path = "/proc/self/fd/" + std::to_string(fd);
  int own = ::open(path.c_str(), O_RDONLY | O_NOCTTY | O_CLOEXEC);
  if (own < 0) throw std::system_error(errno, std::generic_category(), "open " + path);
  return own;
}

// The worker's terminal is out of line mode: readline (pdb) reads it.
bool readline_waits(int pty_master) {
  termios t;
  return tcgetattr(pty_master, &t) == 0 && !(t.c_lflag & ICANON);
}

}  // namespace

StdinForwarder::StdinForwarder(boost::asio::io_context& io, int terminal_fd,
                               std::function<void()> on_line)
    : in_(io, reopen(terminal_fd)), raw_(terminal_fd), on_line_(std::move(on_line)) {}

StdinForwarder::~StdinForwarder() {
  boost::system::error_code ignored;
  in_.close(ignored);
  // raw_'s destructor puts the terminal's modes back.
}

void StdinForwarder::start() { read_more(); }

void StdinForwarder::before_stop() {
  stopped_ = true;
  raw_.leave();  // the shell gets its terminal as it gave it
}

void StdinForwarder::resume() {
  stopped_ = false;
  if (!reading_) read_more();
  update(true);
}

void StdinForwarder::add_target(int rank, pid_t pid, base::ScopedFd fd, bool is_pty,
                                bool preferred, std::function<void(bool)> set_interactive) {
  targets_.erase(std::remove_if(targets_.begin(), targets_.end(),
                                [&](const Target& t) { return t.rank == rank; }),
                 targets_.end());
  Target t{rank, pid, std::move(fd), is_pty, preferred, std::move(set_interactive)};
  targets_.push_back(std::move(t));
  // Raw from the start when this pty gets the input: what is typed ahead
  // goes to its line discipline, which echoes it once.
  update(false);
}

void StdinForwarder::remove_target(pid_t pid) {
  for (auto& t : targets_)
    if (t.pid == pid && pid == passthrough_pid_) {
      if (t.set_interactive) t.set_interactive(false);
      passthrough_pid_ = -1;
    }
  targets_.erase(std::remove_if(targets_.begin(), targets_.end(),
                                [&](const Target& t) { return t.pid == pid; }),
                 targets_.end());
  // A worker killed at its prompt leaves its pty raw: the terminal comes
  // back now, or goes to another rank that waits.
  update(true);
}

void StdinForwarder::clear_target() {
  set_passthrough(nullptr);
  targets_.clear();
}

void StdinForwarder::output_from(pid_t pid) {
  auto it = std::find_if(targets_.begin(), targets_.end(),
                         [&](const Target& t) { return t.pid == pid; });
  if (it == targets_.end() || !it->is_pty) return;
  // One ioctl per read of its output; the rest only when the mode changed.
  // A plain read(0) shows only in /proc: looked at while it passes through
  // for that reason, so its output is lines again once the read returned.
  bool readline = readline_waits(it->fd.get());
  bool reading = it->pid == passthrough_pid_ && !readline
                     ? base::blocked_in_read(pid, STDIN_FILENO)
                     : it->reading;
  if (readline == it->readline && reading == it->reading) return;
  it->readline = readline;
  it->reading = reading;
  update(false);
}

StdinForwarder::Target* StdinForwarder::find_rank(int rank) {
  for (auto& t : targets_)
    if (t.rank == rank) return &t;
  return nullptr;
}

StdinForwarder::Target* StdinForwarder::pick() {
  Target* preferred = nullptr;
  Target* waiting = nullptr;
  Target* chosen = nullptr;
  for (auto& t : targets_) {
    if (t.preferred) preferred = &t;
    if (t.rank == chosen_rank_) chosen = &t;
    if (t.waits() && (!waiting || t.preferred)) waiting = &t;
  }
  // The switch key's choice holds while that rank waits or none does.
  if (chosen && (chosen->waits() || !waiting)) return chosen;
  if (waiting) return waiting;
  if (preferred) return preferred;
  return targets_.empty() ? nullptr : &targets_.front();
}

void StdinForwarder::announce(Target* chosen) {
  if (!chosen) return;
  std::string waiting;
  int n = 0;
  for (const auto& t : targets_)
    if (t.waits()) waiting += (n++ ? ", " : "") + std::to_string(t.rank);
  if (n >= 2 && (waiting != last_waiting_ || chosen->rank != last_rank_)) {
    spdlog::info("ranks {} wait for input; typed input goes to rank {} (Ctrl-] then a rank's "
                 "digit, or Ctrl-] n for the next, switches)",
                 waiting, chosen->rank);
  } else if (tell_ || (chosen->waits() && chosen->rank != last_told_ &&
                        (last_told_ >= 0 || !chosen->preferred))) {
    spdlog::info("typed input goes to rank {}{}", chosen->rank,
                 chosen->waits() ? " (it waits for input)" : "");
  }
  // A rank that does not wait is not told: between two pdb commands the
  // input falls back to --stdin-rank's for a moment.
  if (chosen->waits() || tell_ || n >= 2) last_told_ = chosen->rank;
  last_rank_ = chosen->rank;
  last_waiting_ = n >= 2 ? waiting : "";
  tell_ = false;
}

StdinForwarder::Target* StdinForwarder::update(bool all) {
  if (all)
    for (auto& t : targets_) {
      t.readline = t.is_pty && readline_waits(t.fd.get());
      t.reading = base::blocked_in_read(t.pid, STDIN_FILENO);
    }
  Target* t = pick();
  announce(t);
  set_passthrough(t);
  return t;
}

void StdinForwarder::set_passthrough(Target* t) {
  // Raw while a worker's pty has the input: its own line discipline or its
  // readline edits and echoes, as a terminal of its own would. From the
  // background the terminal is the shell's: no raw mode there.
  bool raw = t && t->is_pty && !stopped_ && raw_.enter();
  if (!raw) raw_.leave();
  // Its output passes through while it waits (its echo, readline's redraw);
  // otherwise it is lines again (its progress bars in the live region).
  pid_t pid = raw && t->waits() ? t->pid : -1;
  if (pid == passthrough_pid_) return;
  for (auto& old : targets_)
    if (old.pid == passthrough_pid_ && old.set_interactive) old.set_interactive(false);
  passthrough_pid_ = pid;
  if (pid >= 0 && t->set_interactive) t->set_interactive(true);
}

void StdinForwarder::switch_to(char key) {
  std::vector<int> ranks;  // the waiting ones, else all
  for (const auto& t : targets_)
    if (t.waits()) ranks.push_back(t.rank);
  if (ranks.empty())
    for (const auto& t : targets_) ranks.push_back(t.rank);
  std::sort(ranks.begin(), ranks.end());
  int rank = -1;
  if (key == 'n' && !ranks.empty()) {
    auto next = std::upper_bound(ranks.begin(), ranks.end(), last_rank_);
    rank = next == ranks.end() ? ranks.front() : *next;
  } else if (key >= '0' && key <= '9') {
    rank = key - '0';
  }
  if (rank < 0 || !find_rank(rank)) {
    spdlog::warn("Ctrl-] {}: no such rank here; input stays with rank {}",
                 key == 'n' ? std::string("n") : std::string(1, key), last_rank_);
    return;
  }
  chosen_rank_ = rank;
  tell_ = true;  // told again, even when it stays
  last_waiting_.clear();
  Target* t = update(true);
  if (t && t->rank != rank)
    spdlog::info("rank {} does not wait for input; input goes to rank {} while it does not",
                 rank, t->rank);
}

void StdinForwarder::handle_input(const char* data, size_t size) {
  std::string out;
  auto flush = [&] {
    if (!out.empty()) forward(update(true), out.data(), out.size());
    out.clear();
  };
  for (size_t i = 0; i < size; ++i) {
    char c = data[i];
    if (skip_newline_) {
      skip_newline_ = false;
      if (c == '\n') continue;
    }
    if (switch_pending_) {
      switch_pending_ = false;
      if (c == 'n' || (c >= '0' && c <= '9')) {
        flush();
        switch_to(c);
        skip_newline_ = !raw_.raw();  // line mode: "^]1" took a line of its own
        continue;
      }
      if (c != kSwitchKey) out += kSwitchKey;  // not a switch: both bytes go on
      out += c;
      continue;
    }
    if (c == kSwitchKey) {
      switch_pending_ = true;
      continue;
    }
    out += c;
  }
  flush();
}

void StdinForwarder::read_more() {
  reading_ = true;
  in_.async_read_some(boost::asio::buffer(buf_), [this](const boost::system::error_code& ec,
                                                        size_t n) {
    if (ec == boost::asio::error::operation_aborted) return;
    if (n > 0) {
      // Line mode: the echo has moved the cursor already; the console
      // learns it before the forwarding may print which rank gets the line.
      if (!raw_.raw() && on_line_ && std::memchr(buf_.data(), '\n', n)) on_line_();
      handle_input(buf_.data(), n);
    }
    if (ec == boost::asio::error::eof) {
      // Ctrl-D in line mode: end of input for the worker. A terminal can
      // still be read after it, so keep reading.
      if (Target* t = update(true)) {
        if (t->is_pty)
          forward(t, "\x04", 1);  // VEOF of the worker's pty (canonical mode)
        else
          t->fd.reset();  // the pipe's reader sees EOF
      }
      read_more();
      return;
    }
    if (ec) {
      reading_ = false;  // EIO in the background; resume() after SIGCONT
      return;
    }
    read_more();
  });
}

void StdinForwarder::forward(Target* t, const char* data, size_t size) {
  if (!t || t->fd.get() < 0) return;
  while (size > 0) {
    ssize_t n = ::write(t->fd.get(), data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      // The worker does not read (its input buffer is full) or is gone:
      // never wait for it on the loop.
      if (!warned_)
        spdlog::warn("the worker reading standard input is not reading it; typed input "
                     "dropped");
      warned_ = true;
      return;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace ddprun::agent
