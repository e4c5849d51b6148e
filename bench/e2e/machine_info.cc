#include "machine_info.h"

#include <amqp.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string_view>

namespace postspool::bench {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The value of the first line of `text` that starts with `key` (after the
// key and any ':' and blanks); empty if none.
std::string LineValue(const std::string& text, std::string_view key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    size_t i = key.size();
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == ':')) ++i;
    return line.substr(i);
  }
  return {};
}

}  // namespace

void DescribeMachine(MachineInfo* m) {
  m->nproc = ::sysconf(_SC_NPROCESSORS_ONLN);
  utsname u;
  if (::uname(&u) == 0) m->kernel = std::string(u.sysname) + " " + u.release + " " + u.machine;
  m->cpu_model = LineValue(ReadFile("/proc/cpuinfo"), "model name");
  m->mem_total = LineValue(ReadFile("/proc/meminfo"), "MemTotal");
  m->loadavg_before = LoadAverage();
  m->librabbitmq_version = amqp_version();
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::tm tm;
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", ::gmtime_r(&now, &tm));
  m->started_utc = buf;
}

std::string IoBackendFromLog(const std::string& log) {
  constexpr std::string_view kKey = "ingest backend: ";
  const size_t at = log.find(kKey);
  if (at == std::string::npos) return {};
  const size_t from = at + kKey.size();
  return log.substr(from, log.find('\n', from) - from);
}

std::string LoadAverage() {
  std::istringstream in(ReadFile("/proc/loadavg"));
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

double ProcessCpuSeconds(pid_t pid) {
  const std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 > stat.size()) return -1;
  std::istringstream in(stat.substr(paren + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  // Fields 3..13 come before utime (14) and stime (15).
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
    if (i == 15) stime = std::strtoull(field.c_str(), nullptr, 10);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

}  // namespace postspool::bench
