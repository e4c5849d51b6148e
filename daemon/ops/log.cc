#include "log.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace postspool::daemon {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kError: return "error";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kInfo: return "info";
    case LogLevel::kDebug: return "debug";
  }
  return "?";
}

// systemd sets JOURNAL_STREAM to "<dev>:<inode>" of the stream it connected
// stderr to; only when stderr is still that stream (not redirected by a
// wrapper or a test) do the lines go to the journal with "<N>" prefixes.
bool StderrIsJournal() {
  const char* env = std::getenv("JOURNAL_STREAM");
  if (env == nullptr) return false;
  unsigned long long dev = 0, ino = 0;
  if (std::sscanf(env, "%llu:%llu", &dev, &ino) != 2) return false;
  struct stat st;
  if (::fstat(STDERR_FILENO, &st) != 0) return false;
  return static_cast<unsigned long long>(st.st_dev) == dev &&
         static_cast<unsigned long long>(st.st_ino) == ino;
}

bool ToJournal() {
  static const bool journal = StderrIsJournal();
  return journal;
}

}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

bool ParseLogLevel(const char* name, LogLevel* level) {
  for (LogLevel l : {LogLevel::kError, LogLevel::kWarning, LogLevel::kInfo, LogLevel::kDebug}) {
    if (std::strcmp(name, LevelName(l)) == 0) {
      *level = l;
      return true;
    }
  }
  return false;
}

bool LogEnabled(LogLevel level) { return static_cast<int>(level) <= g_level.load(); }

void Log(LogLevel level, const char* format, ...) {
  if (!LogEnabled(level)) return;
  char line[2048];
  int n;
  if (ToJournal()) {
    n = std::snprintf(line, sizeof line, "<%d>%s: ", static_cast<int>(level), LevelName(level));
  } else {
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    tm t;
    gmtime_r(&ts.tv_sec, &t);
    n = std::snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ postspoold %s: ",
                      t.tm_year + 1900, t.tm_mon + 1, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec,
                      ts.tv_nsec / 1000000, LevelName(level));
  }
  va_list ap;
  va_start(ap, format);
  const int m = std::vsnprintf(line + n, sizeof line - static_cast<size_t>(n) - 1, format, ap);
  va_end(ap);
  size_t len = static_cast<size_t>(n) + static_cast<size_t>(m < 0 ? 0 : m);
  if (len > sizeof line - 2) len = sizeof line - 2;
  line[len++] = '\n';
  // One write per line, so that lines from two threads never interleave.
  [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, line, len);
}

}  // namespace postspool::daemon
