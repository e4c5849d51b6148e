// The `postspool` commands that talk to a running postspoold through its
// control socket (daemon/control.h): status, drain, metrics, reconnect,
// log-level. Each parses its own options (getopt_long).
//
// Exit codes (docs/client.md, "Exit codes of the control commands"):
//   0  success; for status: the daemon is healthy
//   1  the operation failed: unhealthy, drain timed out, request refused
//   2  usage error
//   3  the daemon cannot be reached (no control socket, nothing listening,
//      no answer in time)
#pragma once

#include <string_view>

namespace postspool::cli {

inline constexpr int kControlExitOk = 0;
inline constexpr int kControlExitFailed = 1;
inline constexpr int kControlExitUsage = 2;
inline constexpr int kControlExitUnreachable = 3;

// True for the names RunControlCommand handles.
bool IsControlCommand(std::string_view name);

// Runs the command `name`; argv[0] is the command name, its options follow.
int RunControlCommand(std::string_view name, int argc, char** argv);

}  // namespace postspool::cli
