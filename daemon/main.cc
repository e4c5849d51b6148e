// postspoold: the per-node post relay. See README.md and docs/configuration.md.
#include <cstdio>
#include <cstring>
#include <string>

#include "config.h"
#include "daemon.h"
#include "log.h"

namespace {

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: postspoold [--config PATH] [--check-config]\n"
               "  --config PATH    configuration file (default /etc/postspool/postspoold.conf;\n"
               "                   a missing default file means built-in defaults)\n"
               "  --check-config   parse and check the configuration (every check start\n"
               "                   makes), print errors and warnings, exit 0 if valid,\n"
               "                   2 if not\n"
               "Runs in the foreground; logs to stderr. SIGTERM stops it cleanly.\n");
}

}  // namespace

int main(int argc, char** argv) {
  using namespace postspool::daemon;
  std::string path = "/etc/postspool/postspoold.conf";
  bool explicit_path = false;
  bool check_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
      path = argv[++i];
      explicit_path = true;
    } else if (std::strcmp(argv[i], "--check-config") == 0) {
      check_only = true;
    } else if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      Usage(stdout);
      return 0;
    } else {
      Usage(stderr);
      return 2;
    }
  }
  Config config;
  postspool::Status s = LoadConfig(path, &config);
  if (!s.ok() && !(s.code() == postspool::StatusCode::kNotFound && !explicit_path)) {
    std::fprintf(stderr, "postspoold: %s\n", s.message().c_str());
    return 2;
  }
  if (check_only) {
    // Everything start checks before it touches anything: a configuration
    // that passes here does not make the daemon exit at start (and systemd
    // restart it in a loop); one that fails exits 2, which the unit does
    // not restart.
    if (s = CheckConfig(config); !s.ok()) {
      std::fprintf(stderr, "postspoold: %s: %s\n", path.c_str(), s.message().c_str());
      return 2;
    }
    for (const std::string& w : ConfigWarnings(config)) {
      std::fprintf(stderr, "postspoold: %s: warning: %s\n", path.c_str(), w.c_str());
    }
    std::printf("postspoold: configuration %s is valid\n", path.c_str());
    return 0;
  }
  LogLevel level;
  if (ParseLogLevel(config.log_level.c_str(), &level)) SetLogLevel(level);
  // The same checks as --check-config, and the same exit status 2, which the
  // unit does not restart: a bad configuration never becomes a restart loop.
  if (s = CheckConfig(config); !s.ok()) {
    PS_LOG_ERROR("configuration %s: %s", path.c_str(), s.message().c_str());
    return 2;
  }
  for (const std::string& w : ConfigWarnings(config)) {
    PS_LOG_WARNING("configuration %s: %s", path.c_str(), w.c_str());
  }
  // systemd (and most shells) start with a soft limit of 1024 open files,
  // far below connections_max; the hard limit is what LimitNOFILE= grants.
  if (postspool::Status raised = RaiseOpenFilesLimit(); !raised.ok()) {
    PS_LOG_WARNING("cannot raise the open files limit: %s", raised.message().c_str());
  }
  s = RunDaemon(config);
  if (!s.ok()) {
    PS_LOG_ERROR("cannot run: %s", s.message().c_str());
    return 1;
  }
  return 0;
}
