// The harness's command line: every size and setting, with its default.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace postspool::bench {

struct BenchFlags {
  // The broker's ceiling: one long-lived publisher with confirms.
  int ceiling_messages = 50000;
  uint32_t ceiling_window = 1000;  // unconfirmed messages in flight
  // Published (and thrown away) before any phase: a broker just started is
  // slower for its first seconds.
  int warmup_messages = 5000;
  // postspool end to end: short-lived client processes through the socket.
  int clients = 32;
  int posts_per_client = 1000;
  // The spool fallback: client processes while no daemon runs.
  int spool_clients = 8;
  int spool_posts_per_client = 1000;
  // The baseline: one broker connection per post.
  int baseline_processes = 8;
  int baseline_posts_per_process = 100;
  // libpostspool's budget per post call (its default is 5 ms).
  uint32_t budget_ms = 5;
  // postspoold's settings.
  std::string io_backend = "auto";     // auto, io_uring, epoll
  std::string durability = "accepted"; // accepted, synced
  // More "key = value" lines for postspoold's configuration (--daemon-config,
  // repeatable), e.g. "publish_window_max = 2000".
  std::vector<std::string> daemon_config;
  // How long to wait for the broker to confirm everything of one phase.
  int drain_timeout_s = 120;
  std::string json_path = "bench-e2e.json";
  bool help = false;
};

// Parses `--name value` and `--name=value`. False, with *error set, for an
// unknown flag or a bad value.
bool ParseFlags(int argc, char** argv, BenchFlags* flags, std::string* error);

// The --help text.
std::string Usage(const char* program);

}  // namespace postspool::bench
