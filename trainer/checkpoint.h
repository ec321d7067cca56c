// Atomic, checksummed checkpoints in one folder.
//
// A checkpoint for step S is two files: "step-<S>.bin", the payload (named
// blobs back to back), and "step-<S>.json", the manifest (step, sampler
// position, world size, the blob table, payload size and SHA-256). Each file
// is written to a temporary name in the same folder, fsynced, renamed into
// place, and the folder fsynced; the manifest goes last, so it is the commit
// point: a crash at any moment leaves either no manifest or a complete
// checkpoint. Only the last `keep` checkpoints are kept.
//
// Loading verifies the manifest parses, the payload has the recorded size
// and SHA-256 and the blob table fits; a checkpoint that fails is skipped
// with a warning naming the file, and the next older one is tried.
// Torch-free: tensors are turned into blobs by the trainer (train_state.h).
// Thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::trainer {

struct Blob {
  std::string name;
  std::string dtype;           // e.g. "float32", "uint8"; free-form to this layer
  std::vector<int64_t> shape;  // informational; bytes is authoritative
  std::vector<uint8_t> bytes;
};

struct Checkpoint {
  int64_t step = 0;              // completed optimizer steps
  int64_t samples_consumed = 0;  // global sampler position
  int world_size = 0;            // of the run that wrote it
  uint64_t seed = 0;
  std::vector<Blob> blobs;

  const Blob* find(const std::string& name) const;
};

struct CheckpointOptions {
  std::string dir = "checkpoints";  // created when missing
  int keep = 3;                     // checkpoints kept after each write (>= 1)
};

class CheckpointDir {
 public:
  explicit CheckpointDir(CheckpointOptions options);

  // Writes `ckpt` atomically, then removes all but the newest `keep`.
  // Returns the manifest's path. Throws TrainerError on any I/O failure.
  std::string write(const Checkpoint& ckpt);

  // The newest checkpoint that verifies, or nullopt when none does.
  // Every skipped one is logged (spdlog warning) with its file name.
  std::optional<Checkpoint> load_newest();

  // Loads and verifies one step; throws TrainerError naming the file.
  Checkpoint load_step(int64_t step);

  // Steps that have a manifest, ascending (verified or not).
  std::vector<int64_t> list_steps() const;

  std::string manifest_path(int64_t step) const;
  std::string payload_path(int64_t step) const;

 private:
  CheckpointOptions options_;
};

// Lower-case hex SHA-256 of `data` (OpenSSL).
std::string sha256_hex(const uint8_t* data, size_t size);

}  // namespace ddprun::trainer
