// Reading the error file a worker leaves in TORCHELASTIC_ERROR_FILE.
//
// torch's @record writes {"message": {"message": "...", "extraInfo":
// {"py_callstack": "...", "timestamp": "..."}}}; a plain {"message": "..."}
// is accepted too. Anything else is reported as unreadable, never thrown.
#pragma once

#include <optional>
#include <string>

namespace ddprun::agent {

struct ErrorReport {
  std::string message;
  std::string traceback;  // may be empty
  std::string timestamp;  // seconds since the epoch as written; may be empty
};

// Nothing when the file does not exist or is empty; a report whose message
// says what is wrong when the file is not the expected JSON.
std::optional<ErrorReport> read_error_file(const std::string& path);

}  // namespace ddprun::agent
