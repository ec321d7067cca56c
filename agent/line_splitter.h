// Cuts a worker's byte stream into whole, prefixed lines.
//
// Bytes after the last newline are carried over to the next feed; a line
// longer than `max_line` is emitted in max_line pieces rather than growing
// without bound; flush() emits a partial last line at EOF. The caller writes
// each feed's output with one write(), so lines from different workers never
// interleave mid-line.
#pragma once

#include <cstddef>
#include <string>

namespace ddprun::agent {

class LineSplitter {
 public:
  static constexpr size_t kDefaultMaxLine = 64 * 1024;

  explicit LineSplitter(std::string prefix, size_t max_line = kDefaultMaxLine)
      : prefix_(std::move(prefix)), max_line_(max_line) {}

  // Appends every completed line of `data`, prefixed and newline-ended, to
  // `out`.
  void feed(const char* data, size_t size, std::string& out);
  // Appends the pending partial line, if any, with a newline.
  void flush(std::string& out);
  size_t pending() const { return partial_.size(); }

 private:
  void emit(const char* data, size_t size, std::string& out);

  std::string prefix_;
  size_t max_line_;
  std::string partial_;
};

// Expands ${role_name} ${rank} ${local_rank} ${host} in `tmpl`; an empty
// template gives torchrun's "[<role><local_rank>]:".
std::string make_line_prefix(const std::string& tmpl, const std::string& role, int rank,
                             int local_rank, const std::string& host);

}  // namespace ddprun::agent
