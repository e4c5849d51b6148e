// The calling thread's last error detail (postspool_last_error), and the
// optional one-line report on stderr (options.log_stderr).
#pragma once

#include <string_view>

namespace postspool::client {

// Replaces the calling thread's detail. Never allocates: the text is kept in
// a fixed thread-local buffer and cut (with "...") when longer.
void SetLastError(std::string_view detail);
// The calling thread's detail; "" before the first failure.
const char* LastError();

// Writes `line` plus a newline to stderr with one write(2), bypassing stdio
// (which the host program may have closed, redirected or locked).
void LogToStderr(std::string_view line);

}  // namespace postspool::client
