// Status: the result of an operation that can fail for an expected operating
// reason (ENOSPC, a sealed segment, a deadline). Bugs are assertions
// (assert.h here), never a Status; bad input is counted and skipped by the
// reader, never a Status of the whole operation.
#pragma once

#include <cerrno>
#include <string>
#include <string_view>
#include <utility>

namespace postspool {

enum class StatusCode : int {
  kOk = 0,
  kIoError,          // a system call failed; errno() says which
  kNoSpace,          // ENOSPC or EDQUOT
  kPermissionDenied, // EACCES or EPERM
  kNotFound,         // ENOENT
  kInvalidArgument,  // the caller passed something that cannot be encoded
  kTooLarge,         // a record or field exceeds its maximum
  kCorruption,       // a file's header or contents are damaged
  kUnsupported,      // a newer format version, or a missing kernel feature
  kTimedOut,         // the deadline passed before the operation could finish
  kSealed,           // the segment was sealed; append to the current one
  kAlreadyExists,    // EEXIST
};

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message, int sys_errno = 0)
      : code_(code), sys_errno_(sys_errno), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  // Maps errno to a code: ENOSPC/EDQUOT -> kNoSpace, EACCES/EPERM ->
  // kPermissionDenied, ENOENT -> kNotFound, anything else -> kIoError.
  // `what` names the operation and its object, e.g. "open /var/spool/x".
  static Status FromErrno(int err, std::string_view what);

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  int sys_errno() const { return sys_errno_; }
  const std::string& message() const { return message_; }
  // "<code name>: <message>", for logs.
  std::string ToString() const;
  // Deliberately drop a status (e.g. best-effort cleanup), visibly.
  void IgnoreError() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  int sys_errno_ = 0;
  std::string message_;
};

const char* StatusCodeName(StatusCode code);

}  // namespace postspool
