// The client's options: the defaults (with their environment variables) and
// the checked, owned copy of a caller's postspool_options.
#pragma once

#include <cstdint>
#include <string>

#include "postspool.h"

namespace postspool::client {

inline constexpr const char* kDefaultSocketPath = "/run/postspool/postspoold.sock";
inline constexpr const char* kDefaultSpoolDir = "/var/spool/postspool/incoming";
inline constexpr uint32_t kDefaultBudgetMs = 5;
inline constexpr uint32_t kDefaultSocketSharePct = 60;

// Environment variables read by postspool_options_init (through
// secure_getenv: ignored in set-user-ID and set-group-ID programs, which
// must not let their caller choose where they create files).
inline constexpr const char* kEnvSocket = "POSTSPOOL_SOCKET";
inline constexpr const char* kEnvSpoolDir = "POSTSPOOL_SPOOL_DIR";
inline constexpr const char* kEnvBudgetMs = "POSTSPOOL_BUDGET_MS";
inline constexpr const char* kEnvSocketSharePct = "POSTSPOOL_SOCKET_SHARE_PCT";
inline constexpr const char* kEnvSyncSpool = "POSTSPOOL_SYNC_SPOOL";
inline constexpr const char* kEnvLogStderr = "POSTSPOOL_LOG_STDERR";
inline constexpr const char* kEnvRing = "POSTSPOOL_RING";

// Fills `options` with the defaults, overridden by the environment. A
// variable whose value does not parse is ignored (the library prints
// nothing unless asked, and the defaults are safe).
void InitOptions(postspool_options* options);

struct ClientOptions {
  std::string socket_path;
  std::string spool_dir;
  uint32_t budget_ms = kDefaultBudgetMs;
  uint32_t socket_share_pct = kDefaultSocketSharePct;
  bool sync_spool = false;
  bool log_stderr = false;
  bool use_ring = true;
};

// Checks and copies a caller's options (NULL: the defaults). Returns
// POSTSPOOL_OK or POSTSPOOL_EINVAL with *detail naming the field.
int CopyOptions(const postspool_options* in, ClientOptions* out, std::string* detail);

}  // namespace postspool::client
