#include "agent/live_region.h"

#include <algorithm>

namespace ddprun::agent {
namespace {

// Length of the escape sequence at text[i] (text[i] == ESC): CSI up to its
// final byte, OSC up to BEL or ST, any other one two bytes.
size_t escape_length(std::string_view text, size_t i) {
  if (i + 1 >= text.size()) return text.size() - i;
  char kind = text[i + 1];
  size_t j = i + 2;
  if (kind == '[') {
    while (j < text.size() && !(text[j] >= 0x40 && text[j] <= 0x7e)) ++j;
    return std::min(j + 1, text.size()) - i;
  }
  if (kind == ']') {
    while (j < text.size() && text[j] != '\a' && !(text[j] == '\x1b' && j + 1 < text.size()))
      ++j;
    return std::min(j + (j < text.size() && text[j] == '\x1b' ? 2 : 1), text.size()) - i;
  }
  return 2;
}

bool is_continuation(char c) { return (static_cast<unsigned char>(c) & 0xc0) == 0x80; }
bool is_control(char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }

}  // namespace

void apply_carriage_returns(std::string& line, bool& after_cr, std::string_view segment) {
  // A '\r' at the end rewrites nothing yet: the text of the next segment does.
  bool trailing = false;
  while (!segment.empty() && segment.back() == '\r') {
    segment.remove_suffix(1);
    trailing = true;
  }
  if (segment.empty()) {
    after_cr = after_cr || trailing;
    return;
  }
  size_t cr = segment.rfind('\r');
  if (cr != std::string_view::npos)
    line.assign(segment.substr(cr + 1));
  else if (after_cr)
    line.assign(segment);
  else
    line.append(segment);
  after_cr = trailing;
}

size_t LiveRegion::columns(std::string_view text) {
  size_t n = 0;
  for (size_t i = 0; i < text.size();) {
    if (text[i] == '\x1b') {
      i += escape_length(text, i);
      continue;
    }
    if (!is_continuation(text[i]) && !is_control(text[i])) ++n;
    ++i;
  }
  return n;
}

std::string LiveRegion::cut(std::string_view text, size_t max) {
  std::string out;
  size_t n = 0;
  bool escaped = false;
  for (size_t i = 0; i < text.size();) {
    if (text[i] == '\x1b') {
      size_t len = escape_length(text, i);
      out.append(text.substr(i, len));
      escaped = true;
      i += len;
      continue;
    }
    bool counts = !is_continuation(text[i]) && !is_control(text[i]);
    if (counts && n == max) {
      if (escaped) out += "\x1b[0m";  // a colour cut off must not run on
      return out;
    }
    if (counts) ++n;
    out += text[i++];
  }
  return out;
}

const std::string* LiveRegion::text_of(const void* source) const {
  for (const auto& l : lines_)
    if (l.source == source) return &l.text;
  return nullptr;
}

bool LiveRegion::holds(const void* source) const {
  return std::any_of(lines_.begin(), lines_.end(),
                     [&](const Line& l) { return l.source == source; });
}

LiveRegion::Line* LiveRegion::find(const void* source) {
  for (auto& l : lines_)
    if (l.source == source) return &l;
  return nullptr;
}

size_t LiveRegion::max_columns() const {
  // One column is kept free: text up to the last one leaves some terminals
  // waiting to wrap, where the next \x1b[K would erase that column.
  return width_ > 1 ? static_cast<size_t>(width_ - 1) : std::string::npos;
}

void LiveRegion::erase(std::string& out) {
  if (drawn_ == 0) return;
  out += '\r';
  if (drawn_ > 1) out += "\x1b[" + std::to_string(drawn_ - 1) + "A";
  out += "\x1b[J";
  drawn_ = 0;
}

void LiveRegion::draw(std::string& out) {
  // Up to the region's first line; each line starts with its own '\r'.
  if (drawn_ > 1) out += "\x1b[" + std::to_string(drawn_ - 1) + "A";
  const size_t max = max_columns();
  for (size_t i = 0; i < lines_.size(); ++i) {
    if (i > 0) out += "\n";
    out += '\r';
    out += cut(lines_[i].text, max);
    out += "\x1b[K";
  }
  if (static_cast<int>(lines_.size()) < drawn_) out += "\x1b[J";
  drawn_ = static_cast<int>(lines_.size());
}

bool LiveRegion::write(const void* source, std::string_view bytes, bool line_start,
                       std::string& out) {
  const size_t last_nl = bytes.rfind('\n');
  const std::string_view complete =
      last_nl == std::string_view::npos ? std::string_view() : bytes.substr(0, last_nl + 1);
  const std::string_view tail =
      last_nl == std::string_view::npos ? bytes : bytes.substr(last_nl + 1);
  std::string normal;
  for (size_t from = 0; from < complete.size();) {
    size_t nl = complete.find('\n', from);
    std::string_view body = complete.substr(from, nl - from);
    std::string text;
    if (from == 0 && holds(source)) {
      // The bar's last update: it leaves the region as a line of its own.
      auto it = std::find_if(lines_.begin(), lines_.end(),
                             [&](const Line& l) { return l.source == source; });
      text = std::move(it->text);
      bool after_cr = it->after_cr;
      lines_.erase(it);
      apply_carriage_returns(text, after_cr, body);
      text = cut(text, max_columns());
    } else if (from == 0 && !line_start) {
      // Ends the source's own prompt line, on the screen now (the region is
      // hidden while one is open): rewritten in place when it has a '\r'.
      if (body.find('\r') != std::string_view::npos) out += '\r';
      bool after_cr = false;
      apply_carriage_returns(text, after_cr, body);
      out += text;
      out += body.find('\r') != std::string_view::npos ? "\x1b[K\n" : "\n";
      line_start = true;
      from = nl + 1;
      continue;
    } else {
      bool after_cr = false;
      apply_carriage_returns(text, after_cr, body);
    }
    normal += text;
    normal += '\n';
    from = nl + 1;
  }
  if (!complete.empty()) line_start = true;
  if (!normal.empty() || (!complete.empty() && drawn_ > 0)) {
    erase(out);
    out += normal;
  }
  if (!tail.empty() && (holds(source) || tail.find('\r') != std::string_view::npos)) {
    Line* line = find(source);
    if (!line) {
      if (!line_start) out += "\r\x1b[K";  // its prompt-like start becomes the bar
      lines_.push_back({source, {}, false});
      line = &lines_.back();
    }
    apply_carriage_returns(line->text, line->after_cr, tail);
    draw(out);
    return false;
  }
  if (!tail.empty()) {
    erase(out);  // hidden under a prompt until a line completes
    out += tail;
    return true;
  }
  if (drawn_ == 0 && !lines_.empty()) draw(out);
  return false;
}

}  // namespace ddprun::agent
