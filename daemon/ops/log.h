// Logging for postspoold: one line per event on stderr, with a syslog
// priority prefix ("<3>") when stderr is the systemd journal (JOURNAL_STREAM
// names stderr's device and inode), a UTC
// timestamp otherwise. Lines say what is wrong and what is done about it.
#pragma once

namespace postspool::daemon {

enum class LogLevel { kError = 3, kWarning = 4, kInfo = 6, kDebug = 7 };

void SetLogLevel(LogLevel level);
// Parses "error", "warning", "info", "debug"; false for anything else.
bool ParseLogLevel(const char* name, LogLevel* level);
bool LogEnabled(LogLevel level);
void Log(LogLevel level, const char* format, ...) __attribute__((format(printf, 2, 3)));

#define PS_LOG_ERROR(...) ::postspool::daemon::Log(::postspool::daemon::LogLevel::kError, __VA_ARGS__)
#define PS_LOG_WARNING(...) ::postspool::daemon::Log(::postspool::daemon::LogLevel::kWarning, __VA_ARGS__)
#define PS_LOG_INFO(...) ::postspool::daemon::Log(::postspool::daemon::LogLevel::kInfo, __VA_ARGS__)
#define PS_LOG_DEBUG(...)                                                          \
  do {                                                                              \
    if (::postspool::daemon::LogEnabled(::postspool::daemon::LogLevel::kDebug))    \
      ::postspool::daemon::Log(::postspool::daemon::LogLevel::kDebug, __VA_ARGS__); \
  } while (0)

}  // namespace postspool::daemon
