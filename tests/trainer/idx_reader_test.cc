#include <doctest/doctest.h>

#include <fstream>
#include <vector>

#include "tests/trainer/temp_dir.h"
#include "trainer/error.h"
#include "trainer/idx_reader.h"

using namespace ddprun::trainer;
using ddprun::trainer::testing::TempDir;

namespace {

void put32(std::vector<uint8_t>& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(uint8_t(v >> s));
}

std::vector<uint8_t> images(uint32_t magic, uint32_t n, uint32_t rows, uint32_t cols,
                            size_t body) {
  std::vector<uint8_t> b;
  put32(b, magic);
  put32(b, n);
  put32(b, rows);
  put32(b, cols);
  for (size_t i = 0; i < body; ++i) b.push_back(uint8_t(i * 7));
  return b;
}

std::vector<uint8_t> labels(uint32_t magic, uint32_t n, std::vector<uint8_t> values) {
  std::vector<uint8_t> b;
  put32(b, magic);
  put32(b, n);
  b.insert(b.end(), values.begin(), values.end());
  return b;
}

void write(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              std::streamsize(bytes.size()));
}

std::string error_of(const std::string& dir) {
  try {
    load_idx_split(dir, "train");
  } catch (const TrainerError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("idx reader loads the embedded digits of any count") {
  IdxSplit train = load_idx_split(std::string(DDPRUN_SOURCE_DIR) + "/data/digits", "train");
  CHECK(train.images.count == 1500);
  CHECK(train.images.rows == 28);
  CHECK(train.images.cols == 28);
  CHECK(train.images.pixels.size() == 1500u * 784u);
  CHECK(train.labels.count == 1500);
  IdxSplit test = load_idx_split(std::string(DDPRUN_SOURCE_DIR) + "/data/digits", "t10k");
  CHECK(test.images.count == 297);
}

TEST_CASE("idx reader round-trips a small hand-made file") {
  TempDir dir;
  write(dir.file("train-images-idx3-ubyte"), images(2051, 3, 2, 2, 12));
  write(dir.file("train-labels-idx1-ubyte"), labels(2049, 3, {4, 0, 9}));
  IdxSplit s = load_idx_split(dir.path(), "train");
  CHECK(s.images.count == 3);
  CHECK(s.images.pixels[5] == 35);
  CHECK(s.labels.labels == std::vector<uint8_t>{4, 0, 9});
}

TEST_CASE("idx reader rejects broken files with one line naming the file") {
  TempDir dir;
  const std::string img = dir.file("train-images-idx3-ubyte");
  const std::string lab = dir.file("train-labels-idx1-ubyte");
  write(lab, labels(2049, 3, {1, 2, 3}));

  SUBCASE("missing") {
    CHECK(error_of(dir.path()).find(img + ": cannot open") == 0);
  }
  SUBCASE("bad magic") {
    write(img, images(2049, 3, 2, 2, 12));
    CHECK(error_of(dir.path()) == img + ": bad idx magic 2049 (expected 2051)");
  }
  SUBCASE("truncated header") {
    write(img, {0, 0, 8, 3, 0});
    CHECK(error_of(dir.path()).find(img + ": truncated idx header") == 0);
  }
  SUBCASE("truncated body") {
    write(img, images(2051, 3, 2, 2, 11));
    CHECK(error_of(dir.path()) ==
          img + ": truncated: header promises 3 images of 2x2 = 12 bytes, file has 11");
  }
  SUBCASE("trailing bytes") {
    write(img, images(2051, 3, 2, 2, 13));
    CHECK(error_of(dir.path()) == img + ": 1 trailing bytes after 3 images of 2x2");
  }
  SUBCASE("count mismatch") {
    write(img, images(2051, 2, 2, 2, 8));
    CHECK(error_of(dir.path()) ==
          lab + ": count mismatch: 3 labels for 2 images in " + img);
  }
  SUBCASE("label out of range") {
    write(img, images(2051, 3, 2, 2, 12));
    write(lab, labels(2049, 3, {1, 12, 3}));
    CHECK(error_of(dir.path()) == lab + ": label 12 at record 1 outside 0-9");
  }
  SUBCASE("truncated labels") {
    write(img, images(2051, 3, 2, 2, 12));
    write(lab, labels(2049, 3, {1, 2}));
    CHECK(error_of(dir.path()).find(lab + ": truncated") == 0);
  }
}
