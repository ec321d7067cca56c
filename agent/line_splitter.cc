#include "agent/line_splitter.h"

#include <cstring>

namespace ddprun::agent {

void LineSplitter::emit(const char* data, size_t size, std::string& out) {
  out += prefix_;
  out.append(data, size);
  out += '\n';
}

void LineSplitter::feed(const char* data, size_t size, std::string& out) {
  const char* end = data + size;
  while (data < end) {
    const char* nl = static_cast<const char*>(std::memchr(data, '\n', end - data));
    size_t room = max_line_ - partial_.size();
    if (!nl) {
      // No newline: keep it, but never beyond max_line bytes.
      while (static_cast<size_t>(end - data) > room) {
        partial_.append(data, room);
        data += room;
        emit(partial_.data(), partial_.size(), out);
        partial_.clear();
        room = max_line_;
      }
      partial_.append(data, end - data);
      return;
    }
    size_t len = static_cast<size_t>(nl - data);
    if (len > room) {
      partial_.append(data, room);
      data += room;
      emit(partial_.data(), partial_.size(), out);
      partial_.clear();
      continue;
    }
    if (partial_.empty()) {
      emit(data, len, out);
    } else {
      partial_.append(data, len);
      emit(partial_.data(), partial_.size(), out);
      partial_.clear();
    }
    data = nl + 1;
  }
}

void LineSplitter::flush(std::string& out) {
  if (partial_.empty()) return;
  emit(partial_.data(), partial_.size(), out);
  partial_.clear();
}

std::string make_line_prefix(const std::string& tmpl, const std::string& role, int rank,
                             int local_rank, const std::string& host) {
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
