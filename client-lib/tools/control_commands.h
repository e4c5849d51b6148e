// The `postspool` commands that talk to a running postspoold through its
// control socket (daemon/ops/control.h): status, drain, metrics, reconnect,
// log-level. Each parses its own options (getopt_long).
//
// Exit codes (exit_codes.h; docs/client.md):
//   0  success; for status: the daemon is healthy
//   1  the operation failed: unhealthy, drain timed out, request refused
//   2  usage error
//   3  the daemon cannot be reached (no control socket, nothing listening,
//      no answer in time)
#pragma once

#include <string_view>

#include "exit_codes.h"

namespace postspool::cli {

// True for the names RunControlCommand handles.
bool IsControlCommand(std::string_view name);

// Runs the command `name`; argv[0] is the command name, its options follow.
int RunControlCommand(std::string_view name, int argc, char** argv);

}  // namespace postspool::cli
