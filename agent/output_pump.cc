#include "agent/output_pump.h"

#include <errno.h>
#include <unistd.h>

#include <boost/asio/error.hpp>

namespace ddprun::agent {

void write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) continue;  // a non-blocking console: retry
      return;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

OutputPump::OutputPump(boost::asio::io_context& io, int read_fd, PumpConfig config)
    : pipe_(io, read_fd), config_(std::move(config)), splitter_(config_.prefix) {}

OutputPump::~OutputPump() {
  *alive_ = false;
  if (config_.log_fd >= 0) ::close(config_.log_fd);
}

void OutputPump::start() { read_more(); }

void OutputPump::read_more() {
  pipe_.async_read_some(boost::asio::buffer(buf_),
                        [this, alive = alive_](const boost::system::error_code& ec,
                                               size_t n) {
                          if (!*alive || !open_) return;
                          if (n > 0) handle(buf_.data(), n);
                          if (ec) {
                            finish();
                            return;
                          }
                          read_more();
                        });
}

void OutputPump::handle(const char* data, size_t size) {
  if (config_.log_fd >= 0) write_all(config_.log_fd, data, size);
  if (config_.console_fd >= 0) {
    batch_.clear();
    splitter_.feed(data, size, batch_);
    if (!batch_.empty()) write_all(config_.console_fd, batch_.data(), batch_.size());
  }
  if (config_.on_data) config_.on_data(std::string_view(data, size));
}

void OutputPump::finish() {
  if (!open_) return;
  open_ = false;
  if (config_.console_fd >= 0) {
    batch_.clear();
    splitter_.flush(batch_);
    if (!batch_.empty()) write_all(config_.console_fd, batch_.data(), batch_.size());
  }
  boost::system::error_code ignored;
  pipe_.close(ignored);
  if (config_.on_eof) config_.on_eof();
}

void OutputPump::close() {
  if (!open_) return;
  // Drain what is already in the pipe without blocking, so the last lines
  // of a killed worker are not lost.
  pipe_.non_blocking(true);
  for (;;) {
    ssize_t n = ::read(pipe_.native_handle(), buf_.data(), buf_.size());
    if (n > 0) {
      handle(buf_.data(), static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  finish();
}

}  // namespace ddprun::agent
