// Reads one worker stream (a pipe) on the event loop and sends it on: raw
// bytes to the log file, prefixed whole lines to the console, the bytes to
// a hook.
//
// Each read's complete lines go to the console in one write(), so lines of
// different workers never mix within a line. Move-only by construction
// (owns the descriptors); close() stops reading and releases them.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>

#include "agent/line_splitter.h"

namespace ddprun::agent {

struct PumpConfig {
  std::string prefix;        // console line prefix
  int console_fd = -1;       // -1: keep this stream off the console
  int log_fd = -1;           // owned; -1: no log file
  std::function<void(std::string_view)> on_data;  // may be empty
  std::function<void()> on_eof;                   // called once
};

class OutputPump {
 public:
  // Takes ownership of `read_fd`.
  OutputPump(boost::asio::io_context& io, int read_fd, PumpConfig config);
  ~OutputPump();
  OutputPump(const OutputPump&) = delete;
  OutputPump& operator=(const OutputPump&) = delete;

  void start();
  // Stops reading now (flushing any partial line); on_eof runs if it has not.
  void close();
  bool open() const { return open_; }

 private:
  void read_more();
  void handle(const char* data, size_t size);
  void finish();

  boost::asio::posix::stream_descriptor pipe_;
  PumpConfig config_;
  LineSplitter splitter_;
  std::array<char, 64 * 1024> buf_;
  std::string batch_;
  bool open_ = true;
  // Read handlers may run after this object is gone (aborted reads are
  // still delivered); they check this flag first.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

// Writes all of `data` to `fd`, retrying on EINTR and short writes; errors
// (a closed console) are ignored: output is best effort, the job goes on.
void write_all(int fd, const char* data, size_t size);

}  // namespace ddprun::agent
