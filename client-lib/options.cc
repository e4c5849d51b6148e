#include "options.h"

#include <sys/un.h>

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace postspool::client {
namespace {

// The size of struct postspool_options in ABI version 0.1: the smallest a
// caller may pass. A larger struct_size comes from a newer header; the
// fields this library does not know are ignored.
// Callers built against 0.1 pass the struct without use_ring.
constexpr size_t kOptionsBytesMin = offsetof(postspool_options, use_ring);
// Budgets above this are surely a mistake (and would overflow nothing, but
// make "never hangs" meaningless).
constexpr uint32_t kBudgetMsMax = 10 * 60 * 1000;

bool ParseUint(const char* text, uint32_t max, uint32_t* out) {
  if (text == nullptr || *text == '\0') return false;
  const std::string_view s(text);
  uint32_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v > max) return false;
  *out = v;
  return true;
}

bool ParseBool(const char* text, bool* out) {
  if (text == nullptr) return false;
  const std::string_view s(text);
  if (s == "1" || s == "true" || s == "yes" || s == "on") {
    *out = true;
    return true;
  }
  if (s == "0" || s == "false" || s == "no" || s == "off" || s.empty()) {
    *out = false;
    return true;
  }
  return false;
}

}  // namespace

void InitOptions(postspool_options* o) {
  std::memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  const char* socket = ::secure_getenv(kEnvSocket);
  o->socket_path = socket != nullptr && *socket != '\0' ? socket : kDefaultSocketPath;
  const char* spool = ::secure_getenv(kEnvSpoolDir);
  o->spool_dir = spool != nullptr && *spool != '\0' ? spool : kDefaultSpoolDir;
  uint32_t v = 0;
  o->budget_ms = ParseUint(::secure_getenv(kEnvBudgetMs), kBudgetMsMax, &v) && v > 0
                     ? v
                     : kDefaultBudgetMs;
  o->socket_share_pct = ParseUint(::secure_getenv(kEnvSocketSharePct), 100, &v)
                            ? v
                            : kDefaultSocketSharePct;
  bool b = false;
  o->sync_spool = ParseBool(::secure_getenv(kEnvSyncSpool), &b) && b ? 1 : 0;
  o->log_stderr = ParseBool(::secure_getenv(kEnvLogStderr), &b) && b ? 1 : 0;
  o->use_ring = ParseBool(::secure_getenv(kEnvRing), &b) && !b ? 0 : 1;
}

int CopyOptions(const postspool_options* in, ClientOptions* out, std::string* detail) {
  postspool_options o;
  InitOptions(&o);
  if (in != nullptr) {
    if (in->struct_size < kOptionsBytesMin) {
      *detail = "options.struct_size is " + std::to_string(in->struct_size) +
                ", below sizeof(struct postspool_options) = " +
                std::to_string(kOptionsBytesMin) + ": initialise with postspool_options_init";
      return POSTSPOOL_EINVAL;
    }
    std::memcpy(&o, in, std::min<size_t>(in->struct_size, sizeof o));
  }
  if (o.socket_path == nullptr) o.socket_path = kDefaultSocketPath;
  if (o.spool_dir == nullptr) o.spool_dir = kDefaultSpoolDir;
  if (*o.socket_path == '\0') {
    *detail = "options.socket_path is empty";
    return POSTSPOOL_EINVAL;
  }
  if (std::strlen(o.socket_path) >= sizeof(sockaddr_un{}.sun_path)) {
    *detail = "options.socket_path is longer than a Unix socket address allows (" +
              std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) + " bytes)";
    return POSTSPOOL_EINVAL;
  }
  if (*o.spool_dir == '\0') {
    *detail = "options.spool_dir is empty";
    return POSTSPOOL_EINVAL;
  }
  if (o.budget_ms == 0 || o.budget_ms > kBudgetMsMax) {
    *detail = "options.budget_ms is " + std::to_string(o.budget_ms) + ", outside 1.." +
              std::to_string(kBudgetMsMax);
    return POSTSPOOL_EINVAL;
  }
  if (o.socket_share_pct > 100) {
    *detail = "options.socket_share_pct is " + std::to_string(o.socket_share_pct) +
              ", above 100";
    return POSTSPOOL_EINVAL;
  }
  out->socket_path = o.socket_path;
  out->spool_dir = o.spool_dir;
  out->budget_ms = o.budget_ms;
  out->socket_share_pct = o.socket_share_pct;
  out->sync_spool = o.sync_spool != 0;
  out->log_stderr = o.log_stderr != 0;
  out->use_ring = o.use_ring != 0;
  return POSTSPOOL_OK;
}

}  // namespace postspool::client
