#include "agent/line_splitter.h"

#include <algorithm>
#include <cstring>

namespace ddprun::agent {
namespace {

const char* find_or_end(const char* from, const char* end, char c) {
  const void* p = std::memchr(from, c, static_cast<size_t>(end - from));
  return p ? static_cast<const char*>(p) : end;
}

}  // namespace

void LineSplitter::start_segment(std::string& out) {
  out += prefix_;
  if (continued_ && !after_cr_) out += kContinuation;
  on_console_ = true;
  after_cr_ = false;
  continued_ = false;
  column_ = 0;
}

void LineSplitter::render(const char* data, size_t size, bool open, std::string& out) {
  if (on_console_ && !open) {
    // Another source ended our line with "\n": mark what continues it, and
    // drop a newline that would only end it again.
    on_console_ = false;
    continued_ = !after_cr_;
    after_cr_ = false;
    column_ = 0;
    if (size > 0 && *data == '\n') {
      ++data;
      --size;
      continued_ = false;
    }
  }
  const char* end = data + size;
  const char* cr = find_or_end(data, end, '\r');
  while (data < end) {
    if (cr < data) cr = find_or_end(data, end, '\r');
    const char* stop = std::min(find_or_end(data, end, '\n'), cr);
    while (data < stop) {
      if (on_console_ && !after_cr_ && column_ >= max_line_) {
        out += '\n';  // cut: the rest continues on a marked line
        on_console_ = false;
        continued_ = true;
      }
      if (!on_console_ || after_cr_) start_segment(out);
      size_t n = std::min(max_line_ - column_, static_cast<size_t>(stop - data));
      out.append(data, n);
      column_ += n;
      data += n;
    }
    if (stop == end) break;
    if (*stop == '\n') {
      if (on_console_)
        out += '\n';
      else if (!continued_)
        (out += prefix_) += '\n';  // an empty line keeps its prefix, as torchrun's
      on_console_ = after_cr_ = continued_ = false;
      column_ = 0;
    } else if (on_console_) {
      out += '\r';  // the line is rewritten in place; its next text gets the prefix again
      after_cr_ = true;
      column_ = 0;
    }  // a '\r' at the start of a line moves nothing
    data = stop + 1;
  }
}

void LineSplitter::feed(const char* data, size_t size, bool open, std::string& out) {
  // Everything up to the last '\n' or '\r' is rendered now; the rest waits.
  const char* p = data + size;
  while (p > data && p[-1] != '\n' && p[-1] != '\r') --p;
  size_t done = static_cast<size_t>(p - data);
  if (done > 0) {
    if (pending_.empty()) {
      render(data, done, open, out);
    } else {
      pending_.append(data, done);
      render(pending_.data(), pending_.size(), open, out);
      pending_.clear();
    }
    open = true;  // our own output decides from here on
  }
  pending_.append(p, size - done);
  size_t column = on_console_ && !after_cr_ ? column_ : 0;
  if (column + pending_.size() > max_line_) {
    render(pending_.data(), pending_.size(), open, out);
    pending_.clear();
  }
}

void LineSplitter::show_pending(bool open, std::string& out) {
  if (pending_.empty()) return;
  render(pending_.data(), pending_.size(), open, out);
  pending_.clear();
}

void LineSplitter::flush(bool open, std::string& out) {
  if (!pending_.empty()) {
    render(pending_.data(), pending_.size(), open, out);
    pending_.clear();
    open = true;
  }
  if (on_console_ && open) out += '\n';
  on_console_ = after_cr_ = continued_ = false;
  column_ = 0;
}

std::string make_line_prefix(const std::string& tmpl, const std::string& role, int rank,
                             int local_rank, const std::string& host) {
  if (prefix_off(tmpl)) return "";
  if (tmpl.empty()) return "[" + role + std::to_string(local_rank) + "]:";
  const std::pair<const char*, std::string> vars[] = {
      {"${role_name}", role},
      {"${rank}", std::to_string(rank)},
      {"${local_rank}", std::to_string(local_rank)},
      {"${host}", host},
  };
  std::string out;
  for (size_t i = 0; i < tmpl.size();) {
    bool replaced = false;
    for (const auto& [name, value] : vars) {
      size_t n = std::strlen(name);
      if (tmpl.compare(i, n, name) == 0) {
        out += value;
        i += n;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += tmpl[i++];
  }
  return out;
}

}  // namespace ddprun::agent
