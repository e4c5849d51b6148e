// A real postspoold process for end-to-end tests: its own directory tree
// (socket, spool, quarantine, journal, metrics, log) under a temporary
// directory, a configuration pointing at the test broker, start, stop with
// SIGTERM, kill with SIGKILL. The binary is $POSTSPOOLD (set by meson).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <istream>
#include <map>
#include <string>
#include <vector>

namespace postspool::testing {

class DaemonProcess {
 public:
  struct Options {
    std::string broker_url;
    std::string exchange;
    std::string io_backend = "auto";
    std::string durability = "accepted";
    // More "key = value" lines for the configuration.
    std::vector<std::string> extra_config;
  };
  explicit DaemonProcess(Options options);
  ~DaemonProcess();  // kills a running daemon, removes its rings and the directory tree
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  // Starts postspoold and waits (up to 10 s) until its socket accepts a
  // connection. False (with the log tail on stderr) if it did not come up.
  bool Start();
  // SIGTERM, then waits up to `timeout_ms`; returns the exit status, or -1
  // if it had to be killed.
  int Stop(int timeout_ms = 30000);
  // SIGKILL and reap.
  void Kill();
  // Rewrites the configuration (same directory tree) for the next Start().
  void Reconfigure(Options options);
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  const std::string& root() const { return root_; }
  std::string socket_path() const { return root_ + "/run/postspoold.sock"; }
  std::string control_socket_path() const { return root_ + "/run/control.sock"; }
  std::string spool_dir() const { return root_ + "/spool/incoming"; }
  std::string quarantine_dir() const { return root_ + "/spool/quarantine"; }
  std::string journal_dir() const { return root_ + "/journal"; }
  std::string ring_dir() const { return root_ + "/rings"; }
  std::string log_path() const { return root_ + "/postspoold.log"; }
  // The counters of the metrics file (written every 100 ms and at exit),
  // without the "postspool_" prefix.
  std::map<std::string, uint64_t> Metrics() const;
  // The same counters from metrics text in the file's format (what the
  // control socket's `metrics` request returns as "text").
  static std::map<std::string, uint64_t> ParseMetrics(std::istream& text);
  std::string LogText() const;

 private:
  void WriteConfig() const;

  Options options_;
  std::string root_;
  pid_t pid_ = -1;
};

// Removes a directory tree (rm -rf), for test cleanup.
void RemoveTree(const std::string& path);
// The System V shared memory id that the daemon's record of `uid`'s ring in
// ring_dir names (FORMAT.md, "The shared-memory ring"), or -1.
int RingRecordId(const std::string& ring_dir, uid_t uid);
// Removes the System V segments that the ring records in ring_dir name.
void RemoveRings(const std::string& ring_dir);
// CPU seconds (user + system) the process has used, from /proc; -1 if unknown.
double CpuSeconds(pid_t pid);

}  // namespace postspool::testing
