#include "last_error.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace postspool::client {
namespace {

// Long enough for both transports' reasons with two long paths; a POD so
// that the thread-local needs no constructor or destructor (the library may
// be loaded into threads it never sees start or end).
constexpr size_t kLastErrorBytesMax = 2048;
thread_local char tls_last_error[kLastErrorBytesMax];

}  // namespace

void SetLastError(std::string_view detail) {
  char* buf = tls_last_error;
  if (detail.size() < kLastErrorBytesMax) {
    std::memcpy(buf, detail.data(), detail.size());
    buf[detail.size()] = '\0';
    return;
  }
  constexpr std::string_view kCut = "...";
  const size_t keep = kLastErrorBytesMax - 1 - kCut.size();
  std::memcpy(buf, detail.data(), keep);
  std::memcpy(buf + keep, kCut.data(), kCut.size());
  buf[kLastErrorBytesMax - 1] = '\0';
}

const char* LastError() { return tls_last_error; }

void LogToStderr(std::string_view line) {
  char buf[kLastErrorBytesMax + 64];
  const size_t n = std::min(line.size(), sizeof buf - 1);
  std::memcpy(buf, line.data(), n);
  buf[n] = '\n';
  const int saved_errno = errno;
  size_t done = 0;
  while (done < n + 1) {
    const ssize_t w = ::write(STDERR_FILENO, buf + done, n + 1 - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;  // nowhere to report that reporting failed
    done += static_cast<size_t>(w);
  }
  errno = saved_errno;
}

}  // namespace postspool::client
