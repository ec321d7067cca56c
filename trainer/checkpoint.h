// Atomic, checksummed checkpoints in one folder.
//
// A checkpoint for step S is two files: "step-<S>.bin", the payload (named
// blobs back to back), and "step-<S>.json", the manifest (step, sampler
// position, world size, the blob table, payload size and SHA-256, and the
// SHA-256 of the manifest itself, checked before anything in it is used).
// Files are written through base::SafeDir: the folder's owner and mode are
// checked (no planted symlink on its path, owner us or root), each file is
// written under a temp name no one can guess (O_TMPFILE, or 128 random bits
// with O_EXCL|O_NOFOLLOW), fsynced, renamed into place by the folder's
// descriptor, and the folder fsynced; the manifest goes last, so it is the
// commit point: a crash at any moment leaves either no manifest or a complete
// checkpoint. A SIGKILL mid-write can leave ".step-*.tmp-*" files or a
// payload without its manifest; remove_leftovers() clears them at start-up.
//
// lock() takes the folder for one run (flock on "lock", holding "host pid"):
// a second run on the same folder is refused, naming the holder.
//
// Pruning never trusts the step number alone: the newest `keep` checkpoints
// that verify are kept, older verified ones and corrupt ones (any step) are
// removed. So corrupt files with high step numbers never push a new, good
// checkpoint out, and the newest checkpoint that verifies is never deleted.
// A write that fails for space (ENOSPC, EDQUOT) prunes first, keeping the
// newest `keep - 1` verified ones (at least one), and retries; failing again
// (room for fewer than `keep`), it says so, keeps only the newest verified
// one and retries once more, so new checkpoints are still written.
//
// Loading verifies the manifest parses, the payload has the recorded size
// and SHA-256 and the blob table fits; a checkpoint that fails is skipped
// with a warning naming the file, and the next older one is tried.
// Torch-free: tensors are turned into blobs by the trainer (train_state.h).
// Thread-compatible.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/safe_file.h"
#include "base/scoped_fd.h"
#include "trainer/error.h"

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
  // Loss of the last step before it was written; NaN when unknown (older
  // checkpoints). A run resumed at or past its last step reports this one.
  double loss = std::numeric_limits<double>::quiet_NaN();
  std::vector<Blob> blobs;

  const Blob* find(const std::string& name) const;
};

struct CheckpointOptions {
  std::string dir = "checkpoints";  // created when missing
  int keep = 3;                     // checkpoints kept after each write (>= 1)
};

// The folder's file system is full (ENOSPC or EDQUOT), even after pruning:
// the checkpoint was not written and nothing it started is left behind.
class CheckpointNoSpace : public TrainerError {
 public:
  using TrainerError::TrainerError;
};

class CheckpointDir {
 public:
  explicit CheckpointDir(CheckpointOptions options);

  // Writes `ckpt` atomically, then prunes (see above). Returns the
  // manifest's path. Throws CheckpointNoSpace when there is no room even
  // after pruning, TrainerError on any other I/O failure; a failed write
  // leaves no file of its own behind.
  std::string write(const Checkpoint& ckpt);

  // Removes what a writer killed mid-write leaves: "step-*.tmp.*" files and
  // payloads without a manifest. Call before anything writes to the folder
  // (only one process writes checkpoints). Returns the paths removed.
  std::vector<std::string> remove_leftovers();

  // The newest checkpoint that verifies, or nullopt when none does.
  // Every skipped one is logged (spdlog warning) with its file name.
  std::optional<Checkpoint> load_newest();

  // Takes the folder for this run (flock, released when the object or the
  // process goes); `holder` ("host pid 123") is written into the lock file.
  // Throws TrainerError naming the holder when another run has it.
  void lock(const std::string& holder);

  // Loads and verifies one step; throws TrainerError naming the file.
  Checkpoint load_step(int64_t step);

  // Steps that have a manifest, ascending (verified or not).
  std::vector<int64_t> list_steps() const;

  std::string manifest_path(int64_t step) const;
  std::string payload_path(int64_t step) const;

 private:
  // Removes corrupt checkpoints and all but the newest `keep_verified`
  // verified ones; `keep_step` (just written) is never removed.
  void prune(size_t keep_verified, int64_t keep_step);
  bool verifies(int64_t step);
  void write_files(const base::SafeDir& dir, int64_t step, const std::vector<uint8_t>& payload,
                   const std::string& manifest);

  CheckpointOptions options_;
  base::ScopedFd lock_;  // the flock()ed lock file, once lock() succeeded
  std::set<int64_t> verified_;  // steps this object wrote or loaded (not re-hashed)
};

// Lower-case hex SHA-256 of `data` (OpenSSL).
std::string sha256_hex(const uint8_t* data, size_t size);

}  // namespace ddprun::trainer
