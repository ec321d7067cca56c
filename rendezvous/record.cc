#include "rendezvous/record.h"

#include <algorithm>

namespace ddprun::rendezvous {

namespace {

constexpr size_t kMaxText = 0xffff;  // a u16 length

std::string str(const char* s) { return std::string(s); }

}  // namespace

RecordWriter::RecordWriter(const RecordKind& kind) : kind_(kind) {
  out_.assign(kind.magic, kind.magic + 3);
  out_.push_back(kind.version);
}

RecordWriter& RecordWriter::u8(uint8_t v) { return put(v, 1); }
RecordWriter& RecordWriter::u16(uint16_t v) { return put(v, 2); }
RecordWriter& RecordWriter::u32(uint32_t v) { return put(v, 4); }
RecordWriter& RecordWriter::u64(uint64_t v) { return put(v, 8); }

RecordWriter& RecordWriter::put(uint64_t v, int bytes) {
  for (int shift = 8 * (bytes - 1); shift >= 0; shift -= 8)
    out_.push_back(static_cast<uint8_t>(v >> shift));
  return *this;
}

RecordWriter& RecordWriter::text(const std::string& text, size_t limit) {
  const size_t n = std::min({text.size(), limit, kMaxText});
  u16(static_cast<uint16_t>(n));
  out_.insert(out_.end(), text.begin(), text.begin() + static_cast<std::ptrdiff_t>(n));
  return *this;
}

RecordWriter& RecordWriter::whole_text(const std::string& text, size_t limit, const char* field) {
  if (text.size() > std::min(limit, kMaxText))
    throw RecordError(str(kind_.name) + ": " + field + " of " + std::to_string(text.size()) +
                      " bytes, the limit is " + std::to_string(std::min(limit, kMaxText)));
  return this->text(text, limit);
}

RecordWriter& RecordWriter::count(size_t n, size_t limit, const char* field) {
  if (n > limit || n > 0xffff)
    throw RecordError(str(kind_.name) + ": " + std::to_string(n) + " " + field +
                      ", it holds at most " + std::to_string(std::min<size_t>(limit, 0xffff)));
  return u16(static_cast<uint16_t>(n));
}

RecordWriter& RecordWriter::wide_count(size_t n, size_t limit, const char* field) {
  if (n > limit || n > 0xffffffffu)
    throw RecordError(str(kind_.name) + ": " + std::to_string(n) + " " + field +
                      ", it holds at most " + std::to_string(std::min<size_t>(limit, 0xffffffffu)));
  return u32(static_cast<uint32_t>(n));
}

RecordReader::RecordReader(const std::vector<uint8_t>& in, const RecordKind& kind, size_t header)
    : in_(in), kind_(kind) {
  if (in.size() < header)
    fail(std::to_string(in.size()) + " bytes, shorter than its " + std::to_string(header) +
         "-byte header");
  if (in[0] != static_cast<uint8_t>(kind.magic[0]) ||
      in[1] != static_cast<uint8_t>(kind.magic[1]) || in[2] != static_cast<uint8_t>(kind.magic[2]))
    fail("no " + std::string(kind.magic, 3) + " magic (written by something other than ddprun)");
  if (in[3] != kind.version)
    fail("version " + std::to_string(in[3]) + ", this ddprun reads " +
         std::to_string(kind.version) + " (every node must run the same ddprun)");
}

void RecordReader::fail(const std::string& what) const {
  throw RecordError(str(kind_.name) + ": " + what);
}

void RecordReader::need(size_t n, const char* field) const {
  if (in_.size() - at_ < n) fail(str("truncated inside the ") + field);
}

uint8_t RecordReader::u8(const char* field) { return static_cast<uint8_t>(take(1, field)); }
uint16_t RecordReader::u16(const char* field) { return static_cast<uint16_t>(take(2, field)); }
uint32_t RecordReader::u32(const char* field) { return static_cast<uint32_t>(take(4, field)); }
uint64_t RecordReader::u64(const char* field) { return take(8, field); }

uint64_t RecordReader::take(size_t bytes, const char* field) {
  need(bytes, field);
  uint64_t v = 0;
  for (size_t i = 0; i < bytes; ++i) v = (v << 8) | in_[at_ + i];
  at_ += bytes;
  return v;
}

std::string RecordReader::text(size_t limit, const char* field) {
  if (in_.size() - at_ < 2) fail(str("truncated before the ") + field + "'s length");
  const size_t n = u16(field);
  if (n > limit)
    fail(str(field) + " of " + std::to_string(n) + " bytes, the limit is " + std::to_string(limit));
  if (in_.size() - at_ < n)
    fail(str("truncated inside the ") + field + " (" + std::to_string(in_.size() - at_) + " of " +
         std::to_string(n) + " bytes)");
  std::string out(in_.begin() + static_cast<std::ptrdiff_t>(at_),
                  in_.begin() + static_cast<std::ptrdiff_t>(at_ + n));
  at_ += n;
  return out;
}

size_t RecordReader::count(size_t limit, size_t item_bytes, const char* field) {
  return check_count(u16(field), limit, item_bytes, field);
}

size_t RecordReader::wide_count(size_t limit, size_t item_bytes, const char* field) {
  return check_count(u32(field), limit, item_bytes, field);
}

size_t RecordReader::check_count(size_t n, size_t limit, size_t item_bytes,
                                 const char* field) const {
  if (n > limit)
    fail(std::to_string(n) + " " + field + ", it holds at most " + std::to_string(limit));
  if (in_.size() - at_ < n * item_bytes)
    fail(str("truncated inside the ") + field + " (" + std::to_string(in_.size() - at_) +
         " bytes for " + std::to_string(n) + " " + field + ")");
  return n;
}

void RecordReader::finish() const {
  if (at_ != in_.size()) fail(std::to_string(in_.size() - at_) + " bytes after its end");
}

}  // namespace ddprun::rendezvous
