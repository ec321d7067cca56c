// The trainer's one error type.
//
// Everything the trainer rejects (a broken data file, a checkpoint that does
// not verify, a flag combination it cannot honour) is a TrainerError whose
// message names the culprit (file, flag, rank). LibTorch's own c10::Error is
// caught at the trainer's boundary (train_main.cc), not converted here.
#pragma once

#include <stdexcept>
#include <string>

namespace ddprun::trainer {

class TrainerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A collective that failed or was abandoned: a peer died or hung, or the
// link broke. Rank-scoped recovery repairs exactly these (the group
// re-forms); any other error is the rank's own (an OOM, a bug) and ends it,
// as no peer's replacement would make the step succeed.
class CollectiveError : public TrainerError {
 public:
  using TrainerError::TrainerError;
};

}  // namespace ddprun::trainer
