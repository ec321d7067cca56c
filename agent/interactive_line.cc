#include "agent/interactive_line.h"

namespace ddprun::agent {

void InteractiveLine::render(std::string_view bytes, bool& line_start, bool& cr,
                             std::string& out) const {
  for (char c : bytes) {
    // The prefix goes in lazily, before the first text of a line or after
    // a '\r': "\r\n" and "\r\r" get none, and a '\r' at the end of one
    // write does not leave a prefix behind if the next write ends the line.
    if ((line_start || cr) && c != '\r' && c != '\n') {
      out += prefix_;
      line_start = cr = false;
    }
    if (c == '\n') line_start = true, cr = false;
    if (c == '\r') cr = true;
    out += c;
  }
}

void InteractiveLine::write(std::string_view bytes, std::string& out) {
  render(bytes, line_start_, cr_, out);
  size_t nl = bytes.rfind('\n');
  if (nl != std::string_view::npos) {
    kept_.assign(bytes.substr(nl + 1));
  } else {
    kept_.append(bytes);
  }
  if (kept_.size() > kMaxKept) {
    size_t cr = kept_.rfind('\r');
    kept_.erase(0, cr == std::string::npos ? kept_.size() - kMaxKept : cr);
  }
}

void InteractiveLine::adopt(std::string_view line) {
  kept_.assign(line.data(), line.size());
  line_start_ = kept_.empty();
  cr_ = !kept_.empty() && kept_.back() == '\r';
}

void InteractiveLine::replay(std::string& out) const {
  bool line_start = true, cr = false;
  render(kept_, line_start, cr, out);
}

}  // namespace ddprun::agent
