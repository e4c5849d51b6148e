#include "status.h"

#include <cstring>

namespace postspool {

Status Status::FromErrno(int err, std::string_view what) {
  StatusCode code = StatusCode::kIoError;
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      code = StatusCode::kNoSpace;
      break;
    case EACCES:
    case EPERM:
      code = StatusCode::kPermissionDenied;
      break;
    case ENOENT:
      code = StatusCode::kNotFound;
      break;
    case EEXIST:
      code = StatusCode::kAlreadyExists;
      break;
    default:
      break;
  }
  std::string msg(what);
  msg += ": ";
  msg += std::strerror(err);
  return Status(code, std::move(msg), err);
}

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kIoError: return "io error";
    case StatusCode::kNoSpace: return "no space";
    case StatusCode::kPermissionDenied: return "permission denied";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kTooLarge: return "too large";
    case StatusCode::kCorruption: return "corruption";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kTimedOut: return "timed out";
    case StatusCode::kSealed: return "sealed";
    case StatusCode::kAlreadyExists: return "already exists";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  std::string s = StatusCodeName(code_);
  s += ": ";
  s += message_;
  return s;
}

}  // namespace postspool
