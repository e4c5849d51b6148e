// The exit codes of every `postspool` subcommand (docs/client.md, "Exit
// status"): one convention, so that scripts can tell a failed operation from
// a mistake in the command line or the input, and from a daemon that is not
// there.
#pragma once

namespace postspool::cli {

inline constexpr int kExitOk = 0;
// The operation failed: some post was not taken; verify found damage.
inline constexpr int kExitFailed = 1;
// A usage error or bad input: an unknown option, a malformed JSON line, a
// post the library refuses for what it says, a file that does not exist.
inline constexpr int kExitUsage = 2;
// The daemon cannot be reached (the control commands: status, drain, metrics).
inline constexpr int kExitNoDaemon = 3;

}  // namespace postspool::cli
