// The one codec of the records the agents of a job leave each other in the
// store: the round's end and formation, the rank failure (job_protocol.h),
// the watchdog's guard records (watchdog/guard_record.h) and the status
// board's stacks requests (introspect/node_board.h). Each record is
//   magic (3 bytes, names the record) | version u8 | fields...
// with every integer big-endian and every text a u16 length then its bytes.
// A record has one encoding: a reader refuses a field out of its limits, a
// count past the bytes present and any byte after the last field, so a
// record that decodes encodes back to the same bytes (the fuzzer's check).
//
// Depends on the standard library alone, so the fuzzer builds it as is.
//
// Thread safety: a writer or a reader is used by one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddprun::rendezvous {

// A record that cannot be read, or a field a writer cannot hold; the
// message names the record and the defect.
class RecordError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A record's name in messages ("rank failure record"), its magic and the
// version this ddprun writes and reads.
struct RecordKind {
  const char* name;
  char magic[3];
  uint8_t version;
};

class RecordWriter {
 public:
  explicit RecordWriter(const RecordKind& kind);
  RecordWriter& u8(uint8_t v);
  RecordWriter& u16(uint16_t v);
  RecordWriter& u32(uint32_t v);
  RecordWriter& u64(uint64_t v);
  // Signed values travel as their two's complement.
  RecordWriter& i64(int64_t v) { return u64(static_cast<uint64_t>(v)); }
  // Cut to `limit` bytes (at most 65535): a longer node id or reason is
  // the writer's to shorten, never a reason to lose the record.
  RecordWriter& text(const std::string& text, size_t limit);
  // A text that must not be cut (an id): RecordError (naming `field`)
  // when longer than `limit`.
  RecordWriter& whole_text(const std::string& text, size_t limit, const char* field);
  // A u16 count of items to follow; RecordError (naming `field`) above
  // `limit`.
  RecordWriter& count(size_t n, size_t limit, const char* field);
  // The same as a u32, for lists that may pass 65535 items.
  RecordWriter& wide_count(size_t n, size_t limit, const char* field);
  std::vector<uint8_t> take() { return std::move(out_); }

 private:
  RecordWriter& put(uint64_t v, int bytes);  // big-endian, its low `bytes`

  RecordKind kind_;
  std::vector<uint8_t> out_;
};

class RecordReader {
 public:
  // Checks the magic and the version, and that `in` holds at least
  // `header` bytes (the magic, the version and the fixed fields after
  // them), so the fixed fields are read without a check each.
  RecordReader(const std::vector<uint8_t>& in, const RecordKind& kind, size_t header);
  uint8_t u8(const char* field);
  uint16_t u16(const char* field);
  uint32_t u32(const char* field);
  uint64_t u64(const char* field);
  int64_t i64(const char* field) { return static_cast<int64_t>(u64(field)); }
  // A u16-prefixed text of at most `limit` bytes.
  std::string text(size_t limit, const char* field);
  // A u16 count of items of `item_bytes` bytes each (at least), at most
  // `limit`: refused before any is read when the bytes left cannot hold
  // them.
  size_t count(size_t limit, size_t item_bytes, const char* field);
  // The same from a u32 (RecordWriter::wide_count).
  size_t wide_count(size_t limit, size_t item_bytes, const char* field);
  // Refuses any byte after the last field.
  void finish() const;
  // Throws RecordError("<record name>: <what>").
  [[noreturn]] void fail(const std::string& what) const;

 private:
  void need(size_t n, const char* field) const;
  uint64_t take(size_t bytes, const char* field);  // big-endian
  size_t check_count(size_t n, size_t limit, size_t item_bytes, const char* field) const;

  const std::vector<uint8_t>& in_;  // the caller's, outliving the reader
  RecordKind kind_;
  size_t at_ = 4;
};

}  // namespace ddprun::rendezvous
