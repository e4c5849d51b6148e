// What the harness reports about the machine and the processes it runs:
// cores, kernel, CPU, load, and a process's CPU time (from /proc).
#pragma once

#include <sys/types.h>

#include <string>

namespace postspool::bench {

struct MachineInfo {
  long nproc = 0;
  std::string kernel;
  std::string cpu_model;
  std::string mem_total;
  std::string rabbitmq_version;
  std::string rabbitmq_platform;
  std::string librabbitmq_version;
  std::string postspoold_path;
  std::string daemon_io_backend;
  std::string started_utc;
  double broker_start_s = 0;
  // /proc/loadavg before and after the run: other work on the machine
  // skews every figure.
  std::string loadavg_before;
  std::string loadavg_after;
};

// Fills what the machine itself says: nproc, kernel, CPU model, memory,
// rabbitmq-c's version, the time, and loadavg_before.
void DescribeMachine(MachineInfo* m);

// The first three fields of /proc/loadavg.
std::string LoadAverage();

// User plus system CPU seconds of process `pid` so far; -1 if unknown.
double ProcessCpuSeconds(pid_t pid);

// The ingest backend postspoold chose, from its log line "ingest backend:
// io_uring" (or "epoll ..." with the reason); empty if not found.
std::string IoBackendFromLog(const std::string& log);

}  // namespace postspool::bench
