// Reader for the MNIST idx format, of any record count.
//
// LibTorch's torch::data::datasets::MNIST insists on MNIST's exact counts
// (60,000 / 10,000); this reader accepts any count, so the embedded digits
// set (1,500 / 297) and a real MNIST download both load. The format: a
// big-endian header (magic 2051 + count + rows + cols for images, magic 2049
// + count for labels) followed by one unsigned byte per pixel or label.
//
// Every defect is a TrainerError naming the file: cannot open, bad magic,
// truncated, trailing bytes, image/label count mismatch, label out of range.
// Torch-free, so its tests build without LibTorch headers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddprun::trainer {

inline constexpr uint32_t kIdxImagesMagic = 2051;
inline constexpr uint32_t kIdxLabelsMagic = 2049;

struct IdxImages {
  int64_t count = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols, row-major
};

struct IdxLabels {
  int64_t count = 0;
  std::vector<uint8_t> labels;
};

IdxImages read_idx_images(const std::string& path);
IdxLabels read_idx_labels(const std::string& path);

// One split of a data set: "<dir>/<prefix>-images-idx3-ubyte" with
// "<dir>/<prefix>-labels-idx1-ubyte" (prefix "train" or "t10k").
struct IdxSplit {
  IdxImages images;
  IdxLabels labels;
};

// Loads both files, checks the counts agree and every label is below
// num_classes.
IdxSplit load_idx_split(const std::string& dir, const std::string& prefix,
                        int num_classes = 10);

}  // namespace ddprun::trainer
