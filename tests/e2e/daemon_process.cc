#include "daemon_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace postspool::testing {

void RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

DaemonProcess::DaemonProcess(Options options) : options_(std::move(options)) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/postspoold-test-XXXXXX";
  root_ = ::mkdtemp(tmpl.data()) ? tmpl : "";
  WriteConfig();
}

void DaemonProcess::Reconfigure(Options options) {
  options_ = std::move(options);
  WriteConfig();
}

void DaemonProcess::WriteConfig() const {
  std::ofstream conf(root_ + "/postspoold.conf");
  conf << "socket_path = " << socket_path() << "\n"
       << "control_socket_path = " << control_socket_path() << "\n"
       << "spool_dir = " << spool_dir() << "\n"
       << "quarantine_dir = " << quarantine_dir() << "\n"
       << "journal_dir = " << journal_dir() << "\n"
       << "ring_dir = " << ring_dir() << "\n"
       << "metrics_file = " << root_ << "/metrics.prom\n"
       << "metrics_interval_ms = 100\n"
       << "post_broker = " << options_.broker_url << "\n"
       << "post_exchange = " << options_.exchange << "\n"
       << "io_backend = " << options_.io_backend << "\n"
       << "durability = " << options_.durability << "\n"
       << "reconnect_delay_max_ms = 1000\n";
  for (const auto& line : options_.extra_config) conf << line << "\n";
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) Kill();
  if (std::getenv("POSTSPOOL_KEEP_TEST_DIRS") == nullptr) {
    RemoveRings(ring_dir());
    RemoveTree(root_);
  }
}

// The rings outlive the daemon (System V segments, FORMAT.md): a test's
// are removed with its directories, or every test would leave its rings
// in the machine's memory until a reboot.
namespace {

// "postspool-ring-1 <key> <shm id>"
int ReadRingRecord(const std::string& path) {
  std::ifstream in(path);
  std::string magic;
  int key = 0, id = -1;
  if (!(in >> magic >> key >> id)) return -1;
  return id;
}

}  // namespace

int RingRecordId(const std::string& ring_dir, uid_t uid) {
  return ReadRingRecord(ring_dir + "/" + std::to_string(uid) + ".shm");
}

void RemoveRings(const std::string& ring_dir) {
  DIR* d = ::opendir(ring_dir.c_str());
  if (d == nullptr) return;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() < 5 || name.compare(name.size() - 4, 4, ".shm") != 0) continue;
    if (const int id = ReadRingRecord(ring_dir + "/" + name); id >= 0) ::shmctl(id, IPC_RMID, nullptr);
  }
  ::closedir(d);
}

double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(text.substr(close + 2));
  std::string f;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14) utime = std::stoull(f);
    if (i == 15) stime = std::stoull(f);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

bool DaemonProcess::Start() {
  const char* bin = std::getenv("POSTSPOOLD");
  if (bin == nullptr) {
    std::fprintf(stderr, "POSTSPOOLD is not set (meson sets it for the test)\n");
    return false;
  }
  const std::string conf = root_ + "/postspoold.conf";
  const std::string log = log_path();
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::dup2(fd, STDERR_FILENO);
      ::dup2(fd, STDOUT_FILENO);
    }
    ::execl(bin, bin, "--config", conf.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  pid_ = pid;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    int status;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      std::fprintf(stderr, "postspoold exited at start:\n%s\n", LogText().c_str());
      return false;
    }
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket_path().c_str());
    const int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    const bool up = ::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(s);
    if (up) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::fprintf(stderr, "postspoold did not come up in 10 s:\n%s\n", LogText().c_str());
  Kill();
  return false;
}

int DaemonProcess::Stop(int timeout_ms) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    int status;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Kill();
  return -1;
}

void DaemonProcess::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

std::map<std::string, uint64_t> DaemonProcess::Metrics() const {
  std::ifstream f(root_ + "/metrics.prom");
  return ParseMetrics(f);
}

std::map<std::string, uint64_t> DaemonProcess::ParseMetrics(std::istream& text) {
  std::map<std::string, uint64_t> out;
  std::string line;
  while (std::getline(text, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.rfind("postspool_", 0) != 0) continue;
    out[line.substr(10, space - 10)] = std::strtoull(line.c_str() + space + 1, nullptr, 10);
  }
  return out;
}

std::string DaemonProcess::LogText() const {
  std::ifstream f(log_path());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace postspool::testing
