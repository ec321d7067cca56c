#include "base/system_error.h"

#include <errno.h>
#include <string.h>

namespace ddprun::base {

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r: returns the text, which may or may not be buf.
  const char* text = ::strerror_r(err, buf, sizeof buf);
  return text ? std::string(text) : "errno " + std::to_string(err);
}

std::string describe_error(std::string_view call, std::string_view target, int err) {
  std::string out(call);
  if (!target.empty()) {
    out += ' ';
    out += target;
  }
  out += ": ";
  out += errno_text(err);
  return out;
}

ErrorKind error_kind(int err) {
  switch (err) {
    case ENOENT:
    case ESRCH: return ErrorKind::not_found;
    case EEXIST: return ErrorKind::exists;
    case EACCES:
    case EPERM: return ErrorKind::permission;
    case EADDRINUSE:
    case EBUSY: return ErrorKind::in_use;
    case ELOOP:
    case EMLINK: return ErrorKind::link_refused;
    case ENOSPC:
    case EDQUOT: return ErrorKind::no_space;
    case ETIMEDOUT: return ErrorKind::timed_out;
    case EINTR: return ErrorKind::interrupted;
    default: return ErrorKind::other;
  }
}

SystemError::SystemError(std::string call, std::string target, int err)
    : std::runtime_error(describe_error(call, target, err)),
      error_(err),
      call_(std::move(call)),
      target_(std::move(target)) {}

void throw_system_error(std::string_view call, std::string_view target, int err) {
  throw SystemError(std::string(call), std::string(target), err);
}

}  // namespace ddprun::base
