#include "trainer/idx_reader.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "base/system_error.h"
#include "trainer/error.h"

namespace ddprun::trainer {
namespace {

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw TrainerError(path + ": cannot open: " + base::errno_text(errno));
  }
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  if (in.bad()) throw TrainerError(path + ": read error");
  return bytes;
}

uint32_t be32(const std::vector<uint8_t>& b, size_t off) {
  return (uint32_t{b[off]} << 24) | (uint32_t{b[off + 1]} << 16) |
         (uint32_t{b[off + 2]} << 8) | uint32_t{b[off + 3]};
}

// Checks magic and that the body is exactly `body` bytes after `header`.
void check_layout(const std::string& path, const std::vector<uint8_t>& b,
                  size_t header, uint32_t want_magic) {
  if (b.size() < header) {
    throw TrainerError(path + ": truncated idx header (" + std::to_string(b.size()) +
                       " bytes, need " + std::to_string(header) + ")");
  }
  const uint32_t magic = be32(b, 0);
  if (magic != want_magic) {
    throw TrainerError(path + ": bad idx magic " + std::to_string(magic) +
                       " (expected " + std::to_string(want_magic) + ")");
  }
}

void check_body(const std::string& path, size_t have, uint64_t want,
                const std::string& what) {
  if (have < want) {
    throw TrainerError(path + ": truncated: header promises " + what + " = " +
                       std::to_string(want) + " bytes, file has " + std::to_string(have));
  }
  if (have > want) {
    throw TrainerError(path + ": " + std::to_string(have - want) +
                       " trailing bytes after " + what);
  }
}

}  // namespace

IdxImages read_idx_images(const std::string& path) {
  std::vector<uint8_t> b = read_file(path);
  constexpr size_t kHeader = 16;
  check_layout(path, b, kHeader, kIdxImagesMagic);
  IdxImages out;
  out.count = be32(b, 4);
  out.rows = be32(b, 8);
  out.cols = be32(b, 12);
  if (out.rows == 0 || out.cols == 0 || out.rows > 4096 || out.cols > 4096) {
    throw TrainerError(path + ": implausible image size " + std::to_string(out.rows) +
                       "x" + std::to_string(out.cols));
  }
  const uint64_t want = uint64_t(out.count) * out.rows * out.cols;
  check_body(path, b.size() - kHeader, want,
             std::to_string(out.count) + " images of " + std::to_string(out.rows) + "x" +
                 std::to_string(out.cols));
  out.pixels.assign(b.begin() + kHeader, b.end());
  return out;
}

IdxLabels read_idx_labels(const std::string& path) {
  std::vector<uint8_t> b = read_file(path);
  constexpr size_t kHeader = 8;
  check_layout(path, b, kHeader, kIdxLabelsMagic);
  IdxLabels out;
  out.count = be32(b, 4);
  check_body(path, b.size() - kHeader, uint64_t(out.count),
             std::to_string(out.count) + " labels");
  out.labels.assign(b.begin() + kHeader, b.end());
  return out;
}

IdxSplit load_idx_split(const std::string& dir, const std::string& prefix,
                        int num_classes) {
  const std::string images_path = dir + "/" + prefix + "-images-idx3-ubyte";
  const std::string labels_path = dir + "/" + prefix + "-labels-idx1-ubyte";
  IdxSplit split{read_idx_images(images_path), read_idx_labels(labels_path)};
  if (split.images.count != split.labels.count) {
    throw TrainerError(labels_path + ": count mismatch: " +
                       std::to_string(split.labels.count) + " labels for " +
                       std::to_string(split.images.count) + " images in " + images_path);
  }
  if (split.images.count == 0) throw TrainerError(images_path + ": no records");
  for (size_t i = 0; i < split.labels.labels.size(); ++i) {
    if (split.labels.labels[i] >= num_classes) {
      throw TrainerError(labels_path + ": label " + std::to_string(split.labels.labels[i]) +
                         " at record " + std::to_string(i) + " outside 0-" +
                         std::to_string(num_classes - 1));
    }
  }
  return split;
}

}  // namespace ddprun::trainer
